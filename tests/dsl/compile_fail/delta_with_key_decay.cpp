// expect: delta\(beta\): the delta rule takes a per-head decay only
#include <ladle/dsl/dsl.h>
using namespace ladle;
int main() { auto s = dsl::scan(dsl::k, dsl::v).delta(dsl::token_head("beta")).decay_k(dsl::token_key("g")); (void)s; }
