// expect: decay_v: a value-side decay varies over the value features
#include <ladle/dsl/dsl.h>
using namespace ladle;
int main() { auto s = dsl::scan(dsl::k, dsl::v).decay_v(dsl::logsigmoid(dsl::token_key("g"))); (void)s; }
