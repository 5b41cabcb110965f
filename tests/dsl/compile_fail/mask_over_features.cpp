// A mask predicate must be one number per (query, key) pair.
// expect: the predicate is one number per \(query, key\) pair
#include <ladle/dsl/dsl.h>
namespace dsl = ladle::dsl;
int main() {
  const auto attention = dsl::softmax(dsl::score).mask(dsl::token_value("x") < 0);
  (void)attention;
}
