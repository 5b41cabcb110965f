// expect: delta\(beta\): the delta rule takes a per-head or key-side decay
#include <ladle/dsl/dsl.h>
using namespace ladle;
int main() { auto s = dsl::scan(dsl::k, dsl::v).delta(dsl::token_head("beta")).decay_v(dsl::token_value("g")); (void)s; }
