// expect: read\(state, q, scale\): the scale must not vary over features
#include <ladle/dsl/dsl.h>
using namespace ladle;
int main() { auto r = dsl::read(dsl::scan(dsl::k, dsl::v), dsl::q, dsl::k); (void)r; }
