// expect: no match for .*operator\+|invalid operands to binary expression
#include <ladle/dsl/dsl.h>
using namespace ladle;
int main() { auto e = dsl::scan(dsl::k, dsl::v) + dsl::q; (void)e; }
