// expect: bonus\(u\): only a read before the update
#include <ladle/dsl/dsl.h>
using namespace ladle;
int main() { auto r = dsl::read(dsl::scan(dsl::k, dsl::v), dsl::q).bonus(dsl::head_key("u")); (void)r; }
