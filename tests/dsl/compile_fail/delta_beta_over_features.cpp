// expect: delta\(beta\): the write strength beta is one value per token and head
#include <ladle/dsl/dsl.h>
using namespace ladle;
int main() { auto s = dsl::scan(dsl::k, dsl::v).delta(dsl::token_key("beta")); (void)s; }
