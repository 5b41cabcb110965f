// expect: scan\(k, v\): the value must vary over the value features
#include <ladle/dsl/dsl.h>
using namespace ladle;
int main() { auto s = dsl::scan(dsl::k, dsl::token_head("v2")); (void)s; }
