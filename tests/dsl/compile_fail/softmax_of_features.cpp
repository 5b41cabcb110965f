// A softmax logit must be one number per (query, key) pair, not a row of features.
// expect: the logit is one number per \(query, key\) pair
#include <ladle/dsl/dsl.h>
namespace dsl = ladle::dsl;
int main() {
  const auto attention = dsl::softmax(dsl::score * dsl::token_key("x"));
  (void)attention;
}
