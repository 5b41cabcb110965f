// The DSL in one include: symbols, elementwise math, the recurrence primitives, lowering.
//
//   using namespace ladle;
//   auto x = dsl::token_key("x");                     // a raw gate input [B,T,H,K]
//   auto tau = dsl::head_param("tau");                // a per-head temperature [H]
//   auto gla_like = dsl::read(dsl::scan(dsl::k, dsl::v).decay_k(dsl::logsigmoid(x) / tau),
//                             dsl::q, dsl::scalar("scale"));
//   ir::Variant variant = dsl::lower(gla_like, "custom_gate");
#pragma once

#include "expression.h"
#include "lower.h"
#include "math.h"
#include "recurrence.h"
#include "softmax.h"
