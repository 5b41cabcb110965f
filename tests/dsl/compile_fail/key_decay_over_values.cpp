// expect: decay_k: a key-side decay varies over the key features
#include <ladle/dsl/dsl.h>
using namespace ladle;
int main() { auto s = dsl::scan(dsl::k, dsl::v).decay_k(dsl::token_value("gv")); (void)s; }
