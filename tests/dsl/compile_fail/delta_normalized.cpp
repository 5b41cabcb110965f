// expect: normalized\(\): the delta rule has no normaliser
#include <ladle/dsl/dsl.h>
using namespace ladle;
int main() { auto r = dsl::read(dsl::scan(dsl::k, dsl::v).delta(0.5), dsl::q).normalized(); (void)r; }
