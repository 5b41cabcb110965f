// expect: l2_normalized\(\): L2 normalisation of q and k belongs to the delta rule
#include <ladle/dsl/dsl.h>
using namespace ladle;
int main() { auto r = dsl::read(dsl::scan(dsl::k, dsl::v), dsl::q).l2_normalized(); (void)r; }
