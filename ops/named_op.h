// What the named recurrent ops (recurrent, gla) share: their gates reach the variant by the
// names their expressions give them, scale defaults to 1/sqrt(K), and the other options
// become RunOptions.
#pragma once

#include "recurrent.h"

namespace ladle::ops {

VariantInputs named_inputs(const TensorView& q, const RecurrentOptions& options);
// The read scale every named recurrent op takes: `scale`, else 1/sqrt(K) (K: q's last dim).
float default_scale(const TensorView& q, std::optional<float> scale);
RunOptions run_options(const RecurrentOptions& options);

}  // namespace ladle::ops
