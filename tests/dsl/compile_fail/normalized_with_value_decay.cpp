// expect: normalisation of the read is defined only without a value-side decay
#include <ladle/dsl/dsl.h>
using namespace ladle;
int main() { auto r = dsl::read(dsl::scan(dsl::k, dsl::v).decay_v(dsl::token_value("gv")), dsl::q).normalized(); (void)r; }
