// expect: read\(state, q\): the query must vary over the key features
#include <ladle/dsl/dsl.h>
using namespace ladle;
int main() { auto r = dsl::read(dsl::scan(dsl::k, dsl::v), dsl::v); (void)r; }
