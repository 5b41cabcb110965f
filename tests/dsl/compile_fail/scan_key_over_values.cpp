// expect: scan\(k, v\): the key must vary over the key features
#include <ladle/dsl/dsl.h>
using namespace ladle;
int main() { auto s = dsl::scan(dsl::v, dsl::v); (void)s; }
