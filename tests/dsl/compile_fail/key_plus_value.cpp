// expect: cannot combine an expression over the key features \[\.\.,K\] with one over the value features
#include <ladle/dsl/dsl.h>
using namespace ladle;
int main() { auto e = dsl::exp(dsl::k) + dsl::v; (void)e; }
