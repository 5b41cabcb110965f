// expect: read_before\(state, q\): the delta rule is read after its update
#include <ladle/dsl/dsl.h>
using namespace ladle;
int main() { auto r = dsl::read_before(dsl::scan(dsl::k, dsl::v).delta(dsl::token_head("beta")), dsl::q); (void)r; }
