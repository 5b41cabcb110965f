// expect: read\(state, q\): the state must be a scan\(k, v\)
#include <ladle/dsl/dsl.h>
using namespace ladle;
int main() { auto r = dsl::read(dsl::k, dsl::q); (void)r; }
