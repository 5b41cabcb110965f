// expect: bonus\(u\): the bonus weighs the key features
#include <ladle/dsl/dsl.h>
using namespace ladle;
int main() { auto r = dsl::read_before(dsl::scan(dsl::k, dsl::v), dsl::q).bonus(dsl::token_value("u")); (void)r; }
