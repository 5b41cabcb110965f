// expect: decay_head: a per-head decay must not vary over features
#include <ladle/dsl/dsl.h>
using namespace ladle;
int main() { auto s = dsl::scan(dsl::k, dsl::v).decay_head(dsl::head_param("g") * dsl::k); (void)s; }
