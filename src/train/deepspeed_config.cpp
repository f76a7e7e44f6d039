#include "train/deepspeed_config.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <fstream>
#include <limits>

#include "anvil/error.hpp"
#include "dist/dist_env.hpp"
#include "optim/optimizer_kind.hpp"

namespace anvil {
namespace {

using json = nlohmann::json;

bool is_auto(const json& v) {
  return v.is_string() && v.get<std::string>() == "auto";
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char ch) { return char(std::tolower(ch)); });
  return s;
}

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& i : items) out += (out.empty() ? "" : ", ") + i;
  return out;
}

class Applier {
 public:
  Applier(TrainConfig& c, const std::string& source, const std::set<std::string>& given)
      : c_(c), src_(source), given_(given) {}

  void apply(const json& ds);

 private:
  TrainConfig& c_;
  const std::string& src_;
  const std::set<std::string>& given_;
  std::vector<std::string> mismatches_;

  [[noreturn]] void bad(const std::string& key, const json& v, const std::string& want) const {
    ANVIL_THROW("{}: DeepSpeed key '{}' must be {} or \"auto\", got {}", src_, key, want, v.dump());
  }
  double number(const std::string& key, const json& v) const {
    if (!v.is_number()) bad(key, v, "a number");
    return v.get<double>();
  }
  int integer(const std::string& key, const json& v) const {
    const bool integral =
        v.is_number_integer() || (v.is_number_float() && v.get<double>() == std::floor(v.get<double>()) &&
                                  std::fabs(v.get<double>()) < 1e18);
    if (!integral) bad(key, v, "an integer");
    const int64_t i = v.is_number_integer() ? v.get<int64_t>() : int64_t(v.get<double>());
    ANVIL_REQUIRE(i >= std::numeric_limits<int>::min() && i <= std::numeric_limits<int>::max(),
                  "{}: DeepSpeed key '{}' is out of range, got {}", src_, key, i);
    return int(i);
  }
  bool boolean(const std::string& key, const json& v) const {
    if (!v.is_boolean()) bad(key, v, "true or false");
    return v.get<bool>();
  }
  std::string string(const std::string& key, const json& v) const {
    if (!v.is_string()) bad(key, v, "a string");
    return v.get<std::string>();
  }
  void object(const std::string& key, const json& v) const {
    ANVIL_REQUIRE(v.is_object(), "{}: DeepSpeed key '{}' must be an object, got {}", src_, key, v.dump());
  }
  // Errors on keys of the block `block` outside `allowed`.
  void only(const std::string& block, const json& v, const std::vector<std::string>& allowed) const {
    for (const auto& [k, _] : v.items()) {
      if (std::find(allowed.begin(), allowed.end(), k) != allowed.end()) continue;
      const std::string near = nearest_key(k, allowed);
      ANVIL_THROW("{}: unsupported DeepSpeed key '{}.{}'{} (supported in '{}': {})", src_, block, k,
                  near.empty() ? "" : " (did you mean '" + block + "." + near + "'?)", block, join(allowed));
    }
  }

  // HF's fill_match: `value` (the DeepSpeed value `raw` read as the field's type) sets `field`, unless the
  // user gave `anvil_key` a different value.
  template <class T>
  void fill(const std::string& ds_key, const json& raw, const char* anvil_key, T& field, const T& value) {
    if (given_.count(anvil_key) && !(field == value)) {
      mismatches_.push_back(
          fmt::format("- ds {}={} vs {}={}", ds_key, raw.dump(), anvil_key, json(field).dump()));
      return;
    }
    field = value;
  }

  void fp16(const json& v);
  void bf16(const std::string& name, const json& v);
  void data_types(const json& v);
  void optimizer(const json& v);
  void zero(const json& v);
  void aio(const std::string& name, const json& v);
  void batch(const json& ds);
  void communication_type(const json& v);
};

void Applier::fp16(const json& v) {
  object("fp16", v);
  only("fp16", v,
       {"enabled", "loss_scale", "initial_scale_power", "loss_scale_window", "hysteresis",
        "consecutive_hysteresis", "min_loss_scale"});
  for (const auto& [k, val] : v.items()) {
    if (is_auto(val)) continue;
    const std::string key = "fp16." + k;
    if (k == "enabled")
      fill(key, val, "fp16", c_.fp16, boolean(key, val));
    else if (k == "loss_scale")
      fill(key, val, "loss_scale", c_.loss_scale, number(key, val));
    else if (k == "initial_scale_power")
      fill(key, val, "initial_scale_power", c_.initial_scale_power, integer(key, val));
    else if (k == "loss_scale_window")
      fill(key, val, "loss_scale_window", c_.loss_scale_window, integer(key, val));
    else if (k == "hysteresis")
      fill(key, val, "hysteresis", c_.hysteresis, integer(key, val));
    else if (k == "consecutive_hysteresis")
      fill(key, val, "consecutive_hysteresis", c_.consecutive_hysteresis, boolean(key, val));
    else if (k == "min_loss_scale")
      fill(key, val, "min_loss_scale", c_.min_loss_scale, number(key, val));
  }
}

void Applier::bf16(const std::string& name, const json& v) {
  object(name, v);
  only(name, v, {"enabled"});
  if (v.contains("enabled") && !is_auto(v["enabled"]))
    fill(name + ".enabled", v["enabled"], "bf16", c_.bf16, boolean(name + ".enabled", v["enabled"]));
}

void Applier::data_types(const json& v) {
  object("data_types", v);
  only("data_types", v, {"grad_accum_dtype"});
  if (v.contains("grad_accum_dtype") && !is_auto(v["grad_accum_dtype"])) {
    const json& val = v["grad_accum_dtype"];
    const std::string t = string("data_types.grad_accum_dtype", val);
    ANVIL_REQUIRE(t == "fp32" || t == "fp16" || t == "bf16",
                  "{}: DeepSpeed key 'data_types.grad_accum_dtype' must be fp32, fp16 or bf16, got '{}'",
                  src_, t);
    fill("data_types.grad_accum_dtype", val, "grad_accum_dtype", c_.grad_accum_dtype, t);
  }
}

void Applier::optimizer(const json& v) {
  object("optimizer", v);
  only("optimizer", v, {"type", "params"});
  ANVIL_REQUIRE(v.contains("type"), "{}: DeepSpeed key 'optimizer' needs a 'type' (Adam or AdamW)", src_);
  const std::string type = v["type"].is_string() ? v["type"].get<std::string>() : v["type"].dump();
  ANVIL_REQUIRE(
      lower(type) == "adam" || lower(type) == "adamw",
      "{}: DeepSpeed optimizer type '{}' is not supported; supported: Adam, AdamW (both run Anvil's AdamW, "
      "with decoupled weight decay); for Adafactor, 8-bit AdamW or SGD use the optim key "
      "(docs/optimizers.md)",
      src_, type);
  // The block selects AdamW: a run that asked for another optimizer disagrees with it.
  if (given_.count("optim") && parse_optimizer(c_.optim) != OptimizerKind::AdamW)
    mismatches_.push_back(fmt::format("- ds optimizer.type={} vs optim={}", type, c_.optim));
  else
    c_.optim = "adamw_torch_fused";
  if (!v.contains("params")) return;
  const json& p = v["params"];
  object("optimizer.params", p);
  only("optimizer.params", p, {"lr", "betas", "eps", "weight_decay", "adam_w_mode"});
  for (const auto& [k, val] : p.items()) {
    if (is_auto(val)) continue;
    const std::string key = "optimizer.params." + k;
    if (k == "lr") {
      fill(key, val, "learning_rate", c_.learning_rate, number(key, val));
    } else if (k == "eps") {
      fill(key, val, "adam_epsilon", c_.adam_epsilon, number(key, val));
    } else if (k == "weight_decay") {
      fill(key, val, "weight_decay", c_.weight_decay, number(key, val));
    } else if (k == "betas") {
      if (!(val.is_array() && val.size() == 2 && val[0].is_number() && val[1].is_number()))
        bad(key, val, "a list of two numbers");
      const double b1 = val[0].get<double>(), b2 = val[1].get<double>();
      const bool clash1 = given_.count("adam_beta1") && c_.adam_beta1 != b1;
      const bool clash2 = given_.count("adam_beta2") && c_.adam_beta2 != b2;
      if (clash1 || clash2) {
        mismatches_.push_back(fmt::format("- ds {}={} vs adam_beta1={}, adam_beta2={}", key, val.dump(),
                                          json(c_.adam_beta1).dump(), json(c_.adam_beta2).dump()));
      } else {
        c_.adam_beta1 = b1;
        c_.adam_beta2 = b2;
      }
    } else if (k == "adam_w_mode") {
      ANVIL_REQUIRE(
          boolean(key, val),
          "{}: DeepSpeed key '{}' is false (Adam with L2 regularisation), which is not supported; Anvil's "
          "optimizer is AdamW (decoupled weight decay, DeepSpeed's default adam_w_mode true)",
          src_, key);
    }
  }
}

// zero_optimization. Stages 0-3 run (zero_stage); their keys are honoured (stage, reduce_bucket_size,
// overlap_comm, allgather_bucket_size) or have nothing to change in Anvil: contiguous_gradients (the
// gradients are always one flat buffer), reduce_scatter (stage 2 always reduce-scatters: the same sums),
// allgather_partitions (the updated shards are always all-gathered), round_robin_gradients (a CPU-offload
// ordering). Stage 3's sizes are accepted with what Anvil does instead (deepspeed_resolution says it): one
// unit (a block) is gathered ahead, at most the first and last units and two others are gathered at once
// (planned memory), every unit is partitioned, and checkpoints always hold the whole model. Offload maps to
// offload_optimizer / offload_param (cpu, nvme with their nvme_path, one directory for both; offload_param's
// buffer_count), sub_group_size
// and the aio block (here or at the top level) to the NVMe keys.
void Applier::zero(const json& v) {
  int stage = 0;
  if (v.is_boolean()) {  // DeepSpeed's legacy form: true is stage 1
    stage = v.get<bool>() ? 1 : 0;
  } else {
    object("zero_optimization", v);
    only("zero_optimization", v,
         {"stage", "allgather_partitions", "allgather_bucket_size", "overlap_comm", "reduce_scatter",
          "reduce_bucket_size", "contiguous_gradients", "round_robin_gradients", "offload_optimizer",
          "offload_param", "sub_group_size", "stage3_max_live_parameters", "stage3_max_reuse_distance",
          "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold",
          "stage3_gather_16bit_weights_on_model_save", "aio"});
    if (v.contains("stage")) {
      const json& s = v["stage"];
      const bool integral = s.is_number_integer();
      ANVIL_REQUIRE(integral, "{}: DeepSpeed key 'zero_optimization.stage' must be an integer 0..3, got {}",
                    src_, s.dump());
      stage = s.get<int>();
    }
  }
  ANVIL_REQUIRE(stage >= 0 && stage <= 3, "{}: DeepSpeed key 'zero_optimization.stage' must be 0..3, got {}",
                src_, stage);
  if (v.is_boolean() || v.contains("stage"))
    fill("zero_optimization.stage", v.is_boolean() ? v : v["stage"], "zero_stage", c_.zero_stage, stage);
  if (!v.is_object()) return;
  std::string nvme_path_from, nvme_path;  // the block whose nvme_path set offload_nvme_path, and that path
  for (const char* block : {"offload_optimizer", "offload_param"}) {
    if (!v.contains(block)) continue;
    const json& o = v[block];
    const std::string name = std::string("zero_optimization.") + block;
    object(name, o);
    const bool optimizer = std::string(block) == "offload_optimizer";
    // DeepSpeed's keys of the block; buffer_count, buffer_size, max_in_cpu, pin_memory and fast_init
    // tune its own swapping and are accepted (deepspeed_resolution says what Anvil does instead).
    only(name, o,
         optimizer ? std::vector<std::string>{"device", "nvme_path", "pin_memory", "buffer_count",
                                              "fast_init", "ratio"}
                   : std::vector<std::string>{"device", "nvme_path", "pin_memory", "buffer_count",
                                              "buffer_size", "max_in_cpu"});
    const std::string key = name + ".device";
    const std::string device = o.contains("device") ? string(key, o["device"]) : "none";
    const json raw = o.contains("device") ? o["device"] : json("none");
    ANVIL_REQUIRE(device == "none" || device == "cpu" || device == "nvme",
                  "{}: DeepSpeed key '{}' is \"{}\": the devices are none, cpu and nvme; set it to one of "
                  "them, or remove '{}'",
                  src_, key, device, name);
    if (o.contains("ratio") && !is_auto(o["ratio"]))
      ANVIL_REQUIRE(number(name + ".ratio", o["ratio"]) == 1.0,
                    "{}: DeepSpeed key '{}.ratio' is {}: partial optimizer offload (a share of the update on "
                    "the GPU) is not supported; remove it (1: everything offloaded)",
                    src_, name, o["ratio"].dump());
    for (const char* flag : {"pin_memory", "fast_init"})
      if (o.contains(flag) && !is_auto(o[flag])) boolean(name + "." + flag, o[flag]);
    for (const char* size : {"buffer_count", "buffer_size", "max_in_cpu"})
      if (o.contains(size) && !is_auto(o[size])) number(name + "." + size, o[size]);
    if (optimizer) {
      fill(key, raw, "offload_optimizer", c_.offload_optimizer, device);
    } else {
      fill(key, raw, "offload_param", c_.offload_param, device);
      if (o.contains("buffer_count") && !is_auto(o["buffer_count"]))
        fill(name + ".buffer_count", o["buffer_count"], "offload_param_buffer_count",
             c_.offload_param_buffer_count, int(number(name + ".buffer_count", o["buffer_count"])));
    }
    if (device != "nvme") continue;
    ANVIL_REQUIRE(
        o.contains("nvme_path"),
        "{}: DeepSpeed key '{}' is \"nvme\" but '{}.nvme_path' is missing: set it to a directory on "
        "the NVMe drive",
        src_, key, name);
    const std::string path = string(name + ".nvme_path", o["nvme_path"]);
    // One directory holds both swap files (offload_nvme_path).
    ANVIL_REQUIRE(nvme_path_from.empty() || path == nvme_path,
                  "{}: DeepSpeed keys '{}' (\"{}\") and '{}.nvme_path' (\"{}\") differ: Anvil keeps the "
                  "optimizer state's and the weights' swap files in one directory (offload_nvme_path); give "
                  "both the same nvme_path",
                  src_, nvme_path_from, nvme_path, name, path);
    fill(name + ".nvme_path", o["nvme_path"], "offload_nvme_path", c_.offload_nvme_path, path);
    nvme_path_from = name + ".nvme_path", nvme_path = path;
  }
  if (v.contains("sub_group_size") && !is_auto(v["sub_group_size"])) {
    const json& g = v["sub_group_size"];
    const double elements = number("zero_optimization.sub_group_size", g);
    ANVIL_REQUIRE(elements >= 1 && elements <= 9e18,
                  "{}: DeepSpeed key 'zero_optimization.sub_group_size' must be >= 1, got {}", src_,
                  g.dump());
    fill("zero_optimization.sub_group_size", g, "sub_group_size", c_.sub_group_size, int64_t(elements));
  }
  // The HF guide's NVMe example puts "aio" inside zero_optimization; DeepSpeed reads it at the top level.
  if (v.contains("aio")) aio("zero_optimization.aio", v["aio"]);
  // Bucket size: DeepSpeed counts elements; Anvil's ddp_bucket_cap_mb counts megabytes of fp32 gradients.
  if (v.contains("reduce_bucket_size") && !is_auto(v["reduce_bucket_size"])) {
    const json& b = v["reduce_bucket_size"];
    const double elements = number("zero_optimization.reduce_bucket_size", b);
    ANVIL_REQUIRE(elements >= 1,
                  "{}: DeepSpeed key 'zero_optimization.reduce_bucket_size' must be >= 1, got {}", src_,
                  b.dump());
    fill("zero_optimization.reduce_bucket_size", b, "ddp_bucket_cap_mb", c_.ddp_bucket_cap_mb,
         elements * 4.0 / (1024.0 * 1024.0));
  }
  if (v.contains("allgather_bucket_size") && !is_auto(v["allgather_bucket_size"])) {
    const json& b = v["allgather_bucket_size"];
    const double elements = number("zero_optimization.allgather_bucket_size", b);
    ANVIL_REQUIRE(elements >= 1 && elements <= 9e18,
                  "{}: DeepSpeed key 'zero_optimization.allgather_bucket_size' must be >= 1, got {}", src_,
                  b.dump());
    fill("zero_optimization.allgather_bucket_size", b, "zero_allgather_bucket_size",
         c_.zero_allgather_bucket_size, int64_t(elements));
  }
  // overlap_comm false: one reduction after the whole backward (ddp_bucket_cap_mb 0).
  if (v.contains("overlap_comm") && !is_auto(v["overlap_comm"]) &&
      !boolean("zero_optimization.overlap_comm", v["overlap_comm"]))
    fill("zero_optimization.overlap_comm", v["overlap_comm"], "ddp_bucket_cap_mb", c_.ddp_bucket_cap_mb, 0.0);
  for (const char* flag : {"allgather_partitions", "overlap_comm", "reduce_scatter", "contiguous_gradients",
                           "round_robin_gradients", "stage3_gather_16bit_weights_on_model_save"})
    if (v.contains(flag) && !is_auto(v[flag])) boolean(std::string("zero_optimization.") + flag, v[flag]);
  for (const char* size : {"allgather_bucket_size", "stage3_max_live_parameters", "stage3_max_reuse_distance",
                           "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold"})
    if (v.contains(size) && !is_auto(v[size])) number(std::string("zero_optimization.") + size, v[size]);
}

// aio (NVMe offload's I/O): block_size is aio_block_size; thread_count x queue_depth requests in flight
// are aio_threads (each of Anvil's I/O threads keeps one); single_submit, overlap_events and use_gds tune
// libaio and GPUDirect Storage, which Anvil does not use, and are accepted.
void Applier::aio(const std::string& name, const json& v) {
  object(name, v);
  only(name, v, {"block_size", "queue_depth", "thread_count", "single_submit", "overlap_events", "use_gds"});
  for (const char* flag : {"single_submit", "overlap_events", "use_gds"})
    if (v.contains(flag) && !is_auto(v[flag])) boolean(name + "." + flag, v[flag]);
  if (v.contains("block_size") && !is_auto(v["block_size"]))
    fill(name + ".block_size", v["block_size"], "aio_block_size", c_.aio_block_size,
         int64_t(integer(name + ".block_size", v["block_size"])));
  const auto count = [&](const char* k, int fallback) {
    if (!v.contains(k) || is_auto(v[k])) return fallback;
    const int n = integer(name + "." + k, v[k]);
    ANVIL_REQUIRE(n >= 1, "{}: DeepSpeed key '{}.{}' must be >= 1, got {}", src_, name, k, n);
    return n;
  };
  if (v.contains("thread_count") || v.contains("queue_depth")) {
    // DeepSpeed's defaults: one thread, a queue of 8.
    const int threads = count("thread_count", 1) * count("queue_depth", 8);
    fill(name + ".thread_count x queue_depth", json(threads), "aio_threads", c_.aio_threads,
         std::min(threads, 256));
  }
}

// train_batch_size = train_micro_batch_size_per_gpu x gradient_accumulation_steps x world size (the
// launcher's: dist_env.hpp). As
// DeepSpeed does, when one of the two factors is unknown (absent from the DeepSpeed config and not
// given in the Anvil config) it is derived from the other; when both are, micro = train_batch_size.
void Applier::batch(const json& ds) {
  if (!ds.contains("train_batch_size") || is_auto(ds["train_batch_size"])) return;
  const int world = dist::read_dist_env().world_size;
  const int total_global = integer("train_batch_size", ds["train_batch_size"]);
  ANVIL_REQUIRE(total_global >= 1, "{}: DeepSpeed key 'train_batch_size' must be >= 1, got {}", src_,
                total_global);
  ANVIL_REQUIRE(
      total_global % world == 0,
      "{}: train_batch_size {} is not a multiple of the world size {} (processes started by the launcher)",
      src_, total_global, world);
  const int total = total_global / world;  // per process: micro-batch x accumulation
  const bool micro_known =
      ds.contains("train_micro_batch_size_per_gpu") || given_.count("per_device_train_batch_size");
  const bool accum_known =
      ds.contains("gradient_accumulation_steps") || given_.count("gradient_accumulation_steps");
  int& micro = c_.per_device_train_batch_size;
  int& accum = c_.gradient_accumulation_steps;
  if (micro_known && !accum_known) {
    ANVIL_REQUIRE(micro >= 1 && total % micro == 0,
                  "{}: train_batch_size {} is not a multiple of the micro-batch {} "
                  "(train_micro_batch_size_per_gpu / per_device_train_batch_size) x world size {}",
                  src_, total_global, micro, world);
    accum = total / micro;
  } else if (accum_known && !micro_known) {
    ANVIL_REQUIRE(
        accum >= 1 && total % accum == 0,
        "{}: train_batch_size {} is not a multiple of gradient_accumulation_steps {} x world size {}", src_,
        total_global, accum, world);
    micro = total / accum;
  } else if (!micro_known && !accum_known) {
    micro = total;
    accum = 1;
  }
  ANVIL_REQUIRE(
      int64_t(micro) * accum == total,
      "{}: train_batch_size {} must equal train_micro_batch_size_per_gpu {} x gradient_accumulation_steps {} "
      "x world size {} = {} (the micro-batch is per_device_train_batch_size, the accumulation "
      "gradient_accumulation_steps of the Anvil config when the DeepSpeed values are \"auto\" or absent)",
      src_, total_global, micro, accum, world, int64_t(micro) * accum * world);
}

// communication_data_type: the type data parallelism reduces gradients in (Anvil's key of the same name);
// accumulation stays in data_types.grad_accum_dtype.
void Applier::communication_type(const json& v) {
  const std::string t = string("communication_data_type", v);
  ANVIL_REQUIRE(t == "fp32" || t == "fp16" || t == "bf16",
                "{}: DeepSpeed key 'communication_data_type' must be fp32, fp16 or bf16, got '{}'", src_, t);
  fill("communication_data_type", v, "communication_data_type", c_.communication_data_type, t);
}

void Applier::apply(const json& ds) {
  ANVIL_REQUIRE(ds.is_object(), "{}: a DeepSpeed config must be a JSON object, got {}", src_,
                ds.is_array() ? "an array" : ds.dump());
  const auto& supported = deepspeed_supported_keys();
  for (const auto& [k, _] : ds.items()) {
    if (std::find(supported.begin(), supported.end(), k) != supported.end() || k == "bfloat16") continue;
    if (k == "scheduler")
      ANVIL_THROW(
          "{}: DeepSpeed key 'scheduler' is not supported: set the schedule in the Anvil config instead "
          "(lr_scheduler_type, warmup_steps; WarmupLR with linear warmup is constant_with_warmup, "
          "WarmupDecayLR is "
          "linear)",
          src_);
    const std::string near = nearest_key(k, supported);
    ANVIL_THROW("{}: unsupported DeepSpeed key '{}'{} (supported: {})", src_, k,
                near.empty() ? "" : " (did you mean '" + near + "'?)", join(supported));
  }
  ANVIL_REQUIRE(!(ds.contains("bf16") && ds.contains("bfloat16")),
                "{}: both 'bf16' and its old name 'bfloat16' are set; keep 'bf16'", src_);

  if (ds.contains("fp16")) fp16(ds["fp16"]);
  if (ds.contains("bf16")) bf16("bf16", ds["bf16"]);
  if (ds.contains("bfloat16")) bf16("bfloat16", ds["bfloat16"]);
  if (ds.contains("data_types")) data_types(ds["data_types"]);
  if (ds.contains("train_micro_batch_size_per_gpu") && !is_auto(ds["train_micro_batch_size_per_gpu"])) {
    const json& v = ds["train_micro_batch_size_per_gpu"];
    fill("train_micro_batch_size_per_gpu", v, "per_device_train_batch_size", c_.per_device_train_batch_size,
         integer("train_micro_batch_size_per_gpu", v));
  }
  if (ds.contains("gradient_accumulation_steps") && !is_auto(ds["gradient_accumulation_steps"])) {
    const json& v = ds["gradient_accumulation_steps"];
    fill("gradient_accumulation_steps", v, "gradient_accumulation_steps", c_.gradient_accumulation_steps,
         integer("gradient_accumulation_steps", v));
  }
  if (ds.contains("gradient_clipping") && !is_auto(ds["gradient_clipping"])) {
    const json& v = ds["gradient_clipping"];
    fill("gradient_clipping", v, "max_grad_norm", c_.max_grad_norm, number("gradient_clipping", v));
  }
  if (ds.contains("steps_per_print") && !is_auto(ds["steps_per_print"])) {
    const json& v = ds["steps_per_print"];
    fill("steps_per_print", v, "logging_steps", c_.logging_steps, int64_t(integer("steps_per_print", v)));
  }
  if (ds.contains("optimizer")) optimizer(ds["optimizer"]);
  if (ds.contains("zero_optimization")) zero(ds["zero_optimization"]);
  if (ds.contains("aio")) aio("aio", ds["aio"]);
  if (ds.contains("communication_data_type") && !is_auto(ds["communication_data_type"]))
    communication_type(ds["communication_data_type"]);
  // wall_clock_breakdown: DeepSpeed's timing printout; Anvil always logs its timings.

  if (!mismatches_.empty()) {
    std::string list;
    for (const auto& m : mismatches_) list += "\n" + m;
    ANVIL_THROW(
        "{}: DeepSpeed config values disagree with the Anvil config (file or command line):{}\nSet these "
        "DeepSpeed values to \"auto\" to take the Anvil values, or drop the Anvil keys to take the DeepSpeed "
        "ones",
        src_, list);
  }
  batch(ds);
  ANVIL_REQUIRE(
      !(c_.fp16 && c_.bf16),
      "{}: fp16 and bf16 are both enabled (fp16.enabled / bf16.enabled here, or fp16 / bf16 in the Anvil "
      "config); choose one",
      src_);
}

}  // namespace

std::vector<std::string> deepspeed_resolution(const json& ds, const TrainConfig& cfg) {
  // DeepSpeed key -> the Anvil keys it sets (empty: accepted with nothing to change, and why).
  struct Mapping {
    const char* ds_key;
    std::vector<const char*> anvil_keys;
    const char* accepted = "";
  };
  static const std::vector<Mapping> table = {
      {"fp16.enabled", {"fp16"}},
      {"fp16.loss_scale", {"loss_scale"}},
      {"fp16.initial_scale_power", {"initial_scale_power"}},
      {"fp16.loss_scale_window", {"loss_scale_window"}},
      {"fp16.hysteresis", {"hysteresis"}},
      {"fp16.consecutive_hysteresis", {"consecutive_hysteresis"}},
      {"fp16.min_loss_scale", {"min_loss_scale"}},
      {"bf16.enabled", {"bf16"}},
      {"bfloat16.enabled", {"bf16"}},
      {"data_types.grad_accum_dtype", {"grad_accum_dtype"}},
      {"train_micro_batch_size_per_gpu", {"per_device_train_batch_size"}},
      {"gradient_accumulation_steps", {"gradient_accumulation_steps"}},
      {"train_batch_size", {"per_device_train_batch_size", "gradient_accumulation_steps"}},
      {"gradient_clipping", {"max_grad_norm"}},
      {"steps_per_print", {"logging_steps"}},
      {"optimizer.type", {"optim"}},
      {"optimizer.params.lr", {"learning_rate"}},
      {"optimizer.params.betas", {"adam_beta1", "adam_beta2"}},
      {"optimizer.params.eps", {"adam_epsilon"}},
      {"optimizer.params.weight_decay", {"weight_decay"}},
      {"optimizer.params.adam_w_mode", {}, "AdamW's decoupled weight decay"},
      {"zero_optimization.stage", {"zero_stage"}},
      {"zero_optimization.reduce_bucket_size", {"ddp_bucket_cap_mb"}},
      {"zero_optimization.overlap_comm", {"ddp_bucket_cap_mb"}},
      {"zero_optimization.allgather_bucket_size", {"zero_allgather_bucket_size"}},
      {"zero_optimization.contiguous_gradients", {}, "the gradients are always one flat buffer"},
      {"zero_optimization.reduce_scatter", {}, "stage 2 always reduce-scatters"},
      {"zero_optimization.allgather_partitions", {}, "the updated shards are always all-gathered"},
      {"zero_optimization.round_robin_gradients", {}, "an ordering for CPU offload"},
      {"zero_optimization.offload_optimizer", {"offload_optimizer"}},
      {"zero_optimization.offload_param", {"offload_param"}},
      {"zero_optimization.sub_group_size", {"sub_group_size"}},
      {"zero_optimization.offload_optimizer.nvme_path", {"offload_nvme_path"}},
      {"zero_optimization.offload_optimizer.buffer_count",
       {},
       "NVMe offload swaps through two sub-group buffers (one updated, one read or written)"},
      {"zero_optimization.offload_optimizer.fast_init",
       {},
       "start-up writes only the state's tables to the new swap file (it reads as zeros)"},
      {"zero_optimization.offload_optimizer.pin_memory", {}, "the staging buffers are always pinned"},
      {"aio.block_size", {"aio_block_size"}},
      {"aio.thread_count", {"aio_threads"}},
      {"aio.queue_depth", {"aio_threads"}},
      {"zero_optimization.aio.block_size", {"aio_block_size"}},
      {"zero_optimization.aio.thread_count", {"aio_threads"}},
      {"zero_optimization.aio.queue_depth", {"aio_threads"}},
      {"zero_optimization.offload_param.pin_memory", {}, "the weight shard or its buffers are always pinned"},
      {"zero_optimization.offload_param.nvme_path", {"offload_nvme_path"}},
      {"zero_optimization.offload_param.buffer_count", {"offload_param_buffer_count"}},
      {"zero_optimization.offload_param.buffer_size",
       {},
       "each buffer holds one unit's piece of the shard (nvme), or the whole shard is in host memory (cpu)"},
      {"zero_optimization.offload_param.max_in_cpu",
       {},
       "nvme keeps only the buffers in host memory; cpu the whole shard"},
      {"zero_optimization.stage3_max_live_parameters",
       {},
       "stage 3 gathers at most the first and last units and two blocks at once, planned in memory"},
      {"zero_optimization.stage3_max_reuse_distance",
       {},
       "a gathered unit is kept until its slot is needed (the last blocks of forward serve backward)"},
      {"zero_optimization.stage3_prefetch_bucket_size",
       {},
       "stage 3 prefetches the next unit (a block) whole"},
      {"zero_optimization.stage3_param_persistence_threshold",
       {},
       "every unit is partitioned; the first and last keep their own slots"},
      {"zero_optimization.stage3_gather_16bit_weights_on_model_save",
       {},
       "checkpoints always hold the whole model (gathered tensor by tensor)"},
      {"communication_data_type", {"communication_data_type"}},
      {"wall_clock_breakdown", {}, "Anvil always logs its timings"},
  };
  const json values = cfg.to_json();
  std::vector<std::string> lines;
  for (const Mapping& m : table) {
    std::string path = std::string("/") + m.ds_key;
    std::replace(path.begin(), path.end(), '.', '/');
    const json::json_pointer at(path);
    if (!ds.contains(at)) continue;
    const json& raw = ds[at];
    std::string line = fmt::format("{}: {}", m.ds_key, raw.dump());
    if (m.anvil_keys.empty()) {
      line += fmt::format(" (accepted: {})", m.accepted);
    } else {
      std::vector<std::string> set;
      for (const char* k : m.anvil_keys) set.push_back(fmt::format("{} {}", k, values.at(k).dump()));
      line += " -> " + join(set);
    }
    lines.push_back(std::move(line));
  }
  // DeepSpeed's 16-bit ZeRO 2-3 computes the gradients in the 16-bit type and accumulates them in fp32;
  // Anvil keeps fp32 unit gradients (stage 0's numbers) unless asked.
  const bool half = cfg.bf16 || cfg.fp16;
  if (half && cfg.zero_stage >= 2 && cfg.grad_accum_dtype == "fp32" && cfg.backward_grad_dtype.empty())
    lines.push_back(fmt::format(
        "note: DeepSpeed writes stage {} gradients in {} and accumulates them in fp32; Anvil writes them in "
        "fp32 (stage 0's numbers) unless backward_grad_dtype is {} (half the gradient slots' memory)",
        cfg.zero_stage, cfg.precision(), cfg.precision()));
  return lines;
}

const std::vector<std::string>& deepspeed_supported_keys() {
  static const std::vector<std::string> keys = {"fp16",
                                                "bf16",
                                                "data_types",
                                                "train_micro_batch_size_per_gpu",
                                                "gradient_accumulation_steps",
                                                "train_batch_size",
                                                "gradient_clipping",
                                                "steps_per_print",
                                                "optimizer",
                                                "zero_optimization",
                                                "communication_data_type",
                                                "aio",
                                                "wall_clock_breakdown"};
  return keys;
}

void apply_deepspeed_json(TrainConfig& cfg, const json& ds, const std::string& source,
                          const std::set<std::string>& given_keys) {
  Applier(cfg, source, given_keys).apply(ds);
}

void apply_deepspeed_config(TrainConfig& cfg, const std::string& path,
                            const std::set<std::string>& given_keys, const std::string& referrer) {
  std::ifstream f(path);
  ANVIL_REQUIRE(f.good(), "DeepSpeed config '{}' not found or not readable{}", path,
                referrer.empty() ? "" : " (the 'deepspeed' key of " + referrer + ")");
  json ds;
  try {
    ds = json::parse(f);
  } catch (const json::parse_error& e) {
    ANVIL_THROW("{}: not valid JSON (DeepSpeed config): {}", path, e.what());
  }
  apply_deepspeed_json(cfg, ds, path, given_keys);
}

}  // namespace anvil
