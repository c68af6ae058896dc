// The problems the ladder's stages are made for, for the default views of `compare` and `roofline`: prefill
// in fp32, prefill on tensor cores, decode in fp32 and in bf16, and FP8 prefill. Each stage is placed on the
// first of them it accepts, so a stage that refuses the prefill problem (decoding) or its dtype (the
// tensor-core and FP8 kernels) still appears. A stage that runs in the CPU emulator is placed on the
// problem's smaller twin: the emulator is some thousand times slower than a GPU.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "common/registry.hpp"

namespace flashlab::cli {

// One problem of the ladder, as the stages on it see it: natively, or in the CPU emulator.
struct LadderSection {
  std::string title;                          // "decode, fp32: one query row over a long KV cache"
  std::string tag;                            // "decode f32": a short name for chart labels
  bool emulated = false;                      // the smaller twin, for stages that run in the CPU emulator
  std::vector<std::string> flags;             // the problem flags that define it (plus --emulate when asked)
  std::vector<const Implementation*> stages;  // the stages placed here
  std::vector<const Implementation*> contrast;  // stages placed elsewhere, run here for contrast
};

struct Ladder {
  std::vector<LadderSection> sections;  // in the ladder's order; the empty ones left out
  std::vector<std::pair<const Implementation*, std::string>> unplaced;  // with why the first problem refused
};

// Places every registered implementation. `emulate`: the command's --emulate (GPU stages in the emulator
// even where a GPU could run them).
Ladder place_on_ladder(bool emulate);

// True when the command line names no implementation and no problem flag: the ladder's default view.
class Args;
bool wants_ladder(const Args& args);

}  // namespace flashlab::cli
