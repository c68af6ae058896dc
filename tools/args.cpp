#include "tools/args.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "common/cuda/device.hpp"
#include "common/error.hpp"
#include "common/npy.hpp"
#include "common/paged_kv.hpp"
#include "common/score_mod.hpp"

namespace flashlab::cli {

Args::Args(const std::vector<std::string>& argv, const std::set<std::string>& valued,
           const std::set<std::string>& switches) {
  for (size_t a = 0; a < argv.size(); ++a) {
    const std::string& word = argv[a];
    if (word.rfind("--", 0) != 0 || word == "--") {
      positional_.push_back(word);
      continue;
    }
    std::string name = word, value;
    bool inline_value = false;
    if (const size_t eq = word.find('='); eq != std::string::npos) {
      name = word.substr(0, eq);
      value = word.substr(eq + 1);
      inline_value = true;
    }
    if (switches.count(name)) {
      if (inline_value) fail(name, " takes no value");
      values_[name] = "1";
    } else if (valued.count(name)) {
      if (!inline_value) {
        if (a + 1 >= argv.size()) fail(name, " needs a value");
        value = argv[++a];
      }
      values_[name] = value;
    } else {
      fail("unknown flag ", name, " (see flashlab help)");
    }
  }
}

std::optional<std::string> Args::get(const std::string& flag) const {
  const auto found = values_.find(flag);
  if (found == values_.end()) return std::nullopt;
  return found->second;
}

int64_t Args::get_int(const std::string& flag, int64_t fallback) const {
  const auto text = get(flag);
  if (!text) return fallback;
  size_t used = 0;
  int64_t value = 0;
  try {
    value = std::stoll(*text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (text->empty() || used != text->size()) fail(flag, " '", *text, "' is not an integer");
  return value;
}

double Args::get_double(const std::string& flag, double fallback) const {
  const auto text = get(flag);
  if (!text) return fallback;
  size_t used = 0;
  double value = 0;
  try {
    value = std::stod(*text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (text->empty() || used != text->size() || !std::isfinite(value))
    fail(flag, " '", *text, "' is not a finite number");
  return value;
}

std::set<std::string> problem_flags() {
  return {
      "--batch",       "--heads",       "--kv-heads",     "--seqlen-q",     "--seqlen-k",  "--head-dim",
      "--scale",       "--window-left", "--window-right", "--seqlens-q",    "--seqlens-k", "--mask",
      "--page-size",   "--dtype",       "--seed",         "--distribution", "--q",         "--k",
      "--v",           "--softcap",     "--alibi-slopes", "--dropout",      "--bias",      "--cu-seqlens-q",
      "--cu-seqlens-k"};
}

std::set<std::string> problem_switches() {
  return {"--causal", "--emulate", "--alibi"};
}

// Copies a .npy array into `tensor`, whose shape the problem fixed: refuses any other shape.
void load_tensor(const NpyArray& array, const std::string& flag, const std::string& path, HostTensor& tensor,
                 const char* layout) {
  if (array.dtype == "|b1") fail(flag, ": ", path, ": dtype bool is not supported here (float32 or float64)");
  if (array.shape != tensor.shape) {
    auto text = [](const std::vector<int64_t>& shape) {
      std::string out = "[";
      for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
      return out + "]";
    };
    fail(flag, ": ", path, ": shape ", text(array.shape), " does not match ", layout, " = ",
         text(tensor.shape));
  }
  for (size_t i = 0; i < array.values.size(); ++i) tensor.data[i] = static_cast<float>(array.values[i]);
}

void attach_mask(Problem& p, const NpyArray& mask, const std::string& what) {
  // Only bool: a float mask could mean "nonzero is visible" or, as PyTorch's float masks do, an additive 0
  // and -inf (the opposite reading). An additive mask is a bias.
  if (mask.dtype != "|b1")
    fail(what, ": must be bool (true where the key is visible), got ", mask.dtype,
         "; an additive float mask of 0 and -inf is a bias");
  if (mask.shape != std::vector<int64_t>{p.seqlen_q, p.seqlen_k})
    fail(what, ": shape must be [seqlen_q, seqlen_k] = [", p.seqlen_q, ", ", p.seqlen_k, "]");
  auto entries = std::make_shared<std::vector<uint8_t>>(mask.values.size());
  for (size_t i = 0; i < entries->size(); ++i) (*entries)[i] = mask.values[i] != 0.0;
  p.mask = std::move(entries);
}

void attach_bias(Problem& p, const NpyArray& bias, const std::string& what) {
  if (bias.dtype == "|b1")
    fail(what, ": must be float (added to the scores), got bool; a bool array is a mask");
  const std::vector<int64_t>& shape = bias.shape;  // [sq, sk], [heads or 1, sq, sk], [batch or 1, ...]
  const size_t n = shape.size();
  if (n < 2 || n > 4 || shape[n - 2] != p.seqlen_q || shape[n - 1] != p.seqlen_k)
    fail(what, ": shape must end in [seqlen_q, seqlen_k] = [", p.seqlen_q, ", ", p.seqlen_k,
         "], with [heads_q or 1] and [batch or 1] before it");
  p.bias_heads = n >= 3 ? shape[n - 3] : 1;
  p.bias_batch = n == 4 ? shape[0] : 1;
  p.bias = std::make_shared<const std::vector<float>>(bias.values.begin(), bias.values.end());
}

namespace {

// The longest sequence of cumulative lengths (0 when they are not increasing; validate() names that).
int64_t longest(const std::vector<int64_t>& cu) {
  int64_t most = 0;
  for (size_t b = 1; b < cu.size(); ++b) most = std::max(most, cu[b] - cu[b - 1]);
  return most;
}

}  // namespace

ProblemSetup problem_from_args(const Args& args, bool with_inputs) {
  ProblemSetup setup;
  Problem& p = setup.problem;
  const int files = args.has("--q") + args.has("--k") + args.has("--v");
  if (files != 0 && files != 3) fail("--q, --k and --v must be given together");
  // Packed variable-length batches: --cu-seqlens-q alone packs K and V the same way (self-attention).
  if (args.has("--cu-seqlens-k") && !args.has("--cu-seqlens-q"))
    fail("--cu-seqlens-k needs --cu-seqlens-q (packed batches pack Q too)");
  if (auto text = args.get("--cu-seqlens-q")) {
    if (args.has("--seqlens-q") || args.has("--seqlens-k"))
      fail("--cu-seqlens-q and --seqlens-q/--seqlens-k: packed sequences have no padding; give one of them");
    p.cu_seqlens_q = parse_lengths(*text, "--cu-seqlens-q");
    if (p.cu_seqlens_q.size() < 2)
      fail("--cu-seqlens-q needs at least two entries: 0 and the end of the first sequence");
    p.cu_seqlens_k = args.has("--cu-seqlens-k") ? parse_lengths(*args.get("--cu-seqlens-k"), "--cu-seqlens-k")
                                                : p.cu_seqlens_q;
  }
  const bool packed = p.packed();
  const size_t rank = packed ? 3 : 4;
  std::optional<NpyArray> q, k, v;
  // The files define the sizes; a size flag given as well must agree.
  auto agree = [&](const char* flag, int64_t from_file) {
    if (args.has(flag) && args.get_int(flag, 0) != from_file)
      fail(flag, " (", args.get_int(flag, 0), ") does not match the input files (", from_file, ")");
    return from_file;
  };
  if (files == 3) {
    q = read_npy(*args.get("--q"), "--q");
    k = read_npy(*args.get("--k"), "--k");
    v = read_npy(*args.get("--v"), "--v");
    if (q->shape.size() != rank)
      fail("--q: ", *args.get("--q"),
           packed ? ": must be 3-D [total_q, heads, head_dim] (packed)"
                  : ": must be 4-D [batch, seqlen_q, heads, head_dim]");
    if (k->shape.size() != rank)
      fail("--k: ", *args.get("--k"),
           packed ? ": must be 3-D [total_k, kv_heads, head_dim] (packed)"
                  : ": must be 4-D [batch, seqlen_k, kv_heads, head_dim]");
    p.heads_q = agree("--heads", q->shape[rank - 2]);
    p.head_dim = agree("--head-dim", q->shape[rank - 1]);
    p.heads_kv = agree("--kv-heads", k->shape[rank - 2]);
    if (packed) {
      if (q->shape[0] != p.cu_seqlens_q.back())
        fail("cu_seqlens_q ends at ", p.cu_seqlens_q.back(), " but --q holds ", q->shape[0], " tokens");
      if (k->shape[0] != p.cu_seqlens_k.back())
        fail("cu_seqlens_k ends at ", p.cu_seqlens_k.back(), " but --k holds ", k->shape[0], " tokens",
             args.has("--cu-seqlens-k") ? "" : " (without --cu-seqlens-k, K and V are packed like Q)");
    } else {
      p.batch = agree("--batch", q->shape[0]);
      p.seqlen_q = agree("--seqlen-q", q->shape[1]);
      p.seqlen_k = agree("--seqlen-k", k->shape[1]);
    }
  } else {
    p.batch = args.get_int("--batch", 1);
    p.heads_q = args.get_int("--heads", 8);
    p.heads_kv = args.get_int("--kv-heads", p.heads_q);
    p.seqlen_q = args.get_int("--seqlen-q", 1024);
    p.seqlen_k = args.get_int("--seqlen-k", p.seqlen_q);
    p.head_dim = args.get_int("--head-dim", 64);
  }
  if (packed) {  // the batch is the number of sequences, seqlen_q/k the longest unless given
    p.batch =
        args.has("--batch") ? args.get_int("--batch", 1) : static_cast<int64_t>(p.cu_seqlens_q.size()) - 1;
    p.seqlen_q = args.get_int("--seqlen-q", std::max<int64_t>(1, longest(p.cu_seqlens_q)));
    p.seqlen_k = args.get_int("--seqlen-k", longest(p.cu_seqlens_k));
  }
  if (args.has("--emulate")) cuda::force_emulation(true);
  if (args.has("--scale")) p.scale = args.get_double("--scale", 0.0);
  p.causal = args.has("--causal");
  p.window_left = args.get_int("--window-left", -1);
  p.window_right = args.get_int("--window-right", -1);
  if (auto text = args.get("--seqlens-q")) p.seqlens_q = parse_lengths(*text, "--seqlens-q");
  if (auto text = args.get("--seqlens-k")) p.seqlens_k = parse_lengths(*text, "--seqlens-k");
  p.page_size = args.get_int("--page-size", 0);
  if (auto text = args.get("--dtype")) p.dtype = parse_dtype(*text);
  if (args.has("--softcap")) {
    p.softcap = args.get_double("--softcap", 0.0);
    if (!(p.softcap > 0.0)) fail("--softcap (", p.softcap, ") must be > 0");
  }
  if (args.has("--alibi") && args.has("--alibi-slopes")) fail("--alibi and --alibi-slopes: give one of them");
  if (args.has("--alibi")) p.alibi_slopes = alibi_slopes(p.heads_q);
  if (auto text = args.get("--alibi-slopes"))
    for (const double slope : parse_numbers(*text, "--alibi-slopes"))
      p.alibi_slopes.push_back(static_cast<float>(slope));
  if (args.has("--dropout")) {
    p.dropout_p = args.get_double("--dropout", 0.0);
    if (!(p.dropout_p >= 0.0 && p.dropout_p < 1.0)) fail("--dropout (", p.dropout_p, ") must be in [0, 1)");
    p.dropout_seed = static_cast<uint64_t>(args.get_int("--seed", 0));  // the inputs' seed seeds the mask too
  }
  // Sizes are checked before anything is allocated from them.
  p.validate();
  if (auto path = args.get("--mask")) attach_mask(p, read_npy(*path, "--mask"), "--mask: " + *path);
  if (auto path = args.get("--bias")) attach_bias(p, read_npy(*path, "--bias"), "--bias: " + *path);
  p.validate();
  // Refuse, rather than be killed by the kernel's OOM killer, when inputs and outputs alone exceed the memory
  // here.
  double bytes = 4.0 * (2.0 * p.q_elements() + 2.0 * p.kv_elements() + p.lse_elements());
  if (p.page_size > 0) bytes += 4.0 * 2.0 * p.kv_elements();  // the paged copy of K and V
  const double physical =
      static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGE_SIZE));
  if (bytes > 0.8 * physical)
    fail("the problem's inputs and outputs need ", bytes / (1 << 30), " GiB but this machine has ",
         physical / (1 << 30), " GiB (reduce --batch, --heads, --seqlen-q, --seqlen-k or --head-dim)");
  if (!with_inputs) return setup;
  if (files == 3) {
    setup.inputs = empty_inputs(p);
    const char* q_layout = packed ? "[total_q, heads, head_dim]" : "[batch, seqlen_q, heads, head_dim]";
    const char* kv_layout =
        packed ? "[total_k, kv_heads, head_dim]" : "[batch, seqlen_k, kv_heads, head_dim]";
    load_tensor(*q, "--q", *args.get("--q"), setup.inputs.q, q_layout);
    load_tensor(*k, "--k", *args.get("--k"), setup.inputs.k, kv_layout);
    load_tensor(*v, "--v", *args.get("--v"), setup.inputs.v, kv_layout);
    setup.input_source = *args.get("--q") + ", " + *args.get("--k") + ", " + *args.get("--v");
  } else {
    const Distribution distribution = parse_distribution(args.get("--distribution").value_or("normal"));
    const int64_t seed = args.get_int("--seed", 0);
    setup.inputs = random_inputs(p, distribution, static_cast<uint64_t>(seed));
    setup.input_source = "random " + std::string(to_string(distribution)) + ", seed " + std::to_string(seed);
  }
  attach_paged_kv(p, setup.inputs);  // --page-size P: K/V also stored in pages behind a shuffled block table
  return setup;
}

const Implementation& implementation_from_args(const Args& args, const char* command) {
  if (args.positional().empty()) fail(command, " needs an implementation name (see flashlab list)");
  if (args.positional().size() > 1) {
    std::string names;
    for (const std::string& name : args.positional()) names += (names.empty() ? "'" : ", '") + name + "'";
    fail(command, " takes one implementation name, got ", names,
         " (a switch such as --causal takes no value; see flashlab list)");
  }
  return *implementations_from_args(args).front();
}

std::vector<const Implementation*> implementations_from_args(const Args& args,
                                                             bool (*keep)(const Implementation&)) {
  std::vector<const Implementation*> chosen;
  for (const std::string& name : args.positional()) {
    const Implementation* impl = find_implementation(name);
    if (impl == nullptr) fail("unknown implementation '", name, "' (see flashlab list)");
    chosen.push_back(impl);
  }
  if (chosen.empty())
    for (const Implementation& impl : implementations())
      if (keep == nullptr || keep(impl)) chosen.push_back(&impl);
  return chosen;
}

int64_t repeats_from_args(const Args& args, int64_t fallback, int64_t minimum) {
  const int64_t repeats = args.get_int("--repeat", fallback);
  if (repeats < minimum) fail("--repeat (", repeats, ") must be >= ", minimum);
  return repeats;
}

}  // namespace flashlab::cli
