// The CPU kernels of torch.ops.pyw8a8.linear and gated_linear: the core's call object
// (pyw8a8/_simd/call.h) called straight from the dispatcher, with no Python and no numpy
// in between; and the eager layers' entries into those operators.
//
// The schemas are defined in Python (pyw8a8/torch/_ops.py); this library registers their
// CPU kernels.  It reaches the core through call.h's table (the capsule
// pyw8a8._kernels.CALL_API), so it is built against the installed torch alone and never
// ties the core to a torch version.  Everything a call needs is the core's: the plan of a
// weight (checked once, contents included), the blocking and its tuning, the scratch, the
// output memory, the checks of a call and their messages.  This file keeps only what is
// torch's: a map from a weight's tensors to its plan, and the checks of tensors (device,
// dtype, layout, gradient), whose messages are its own.
#include <torch/extension.h>

#include <ATen/Parallel.h>
#include <c10/core/GradMode.h>
#include <pthread.h>

#include <array>
#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "call.h"

namespace py = pybind11;

namespace {

constexpr size_t kMaxPlans = 4096;
// Outputs from this size come from the core's kept memory (outputs.h says why).
constexpr size_t kPooledFromBytes = 64 * 1024;

const w8_call_api *g_api = nullptr;
std::atomic<int64_t> g_calls{0};  // products run, for the tests of what runs where

// The arguments' names in the core's messages (W8_ARG_* order): linear's, gated_linear's.
const char *const kLinearNames[W8_ARG_COUNT] = {"x", "weight", "up", "bias", "bias2"};
const char *const kGatedNames[W8_ARG_COUNT] = {"x", "gate", "up", "bias1", "bias2"};

const char kInferenceOnly[] =
    " requires grad, and pyw8a8 layers are inference only: run the model under "
    "torch.inference_mode() or torch.no_grad()";

// The core's fault, raised with its message, as numpy's API raises it.
[[noreturn]] void raise_fault(const w8_fault &fault, const char *const names[W8_ARG_COUNT],
                              const at::Tensor *x, const std::string &activation_arg,
                              const std::string &activation) {
    w8_fault_names n{};
    for (int i = 0; i < W8_ARG_COUNT; i++) n.name[i] = names[i];
    std::vector<int64_t> shape;
    if (x != nullptr) shape.assign(x->sizes().begin(), x->sizes().end());
    n.ndim = static_cast<int>(shape.size());
    n.shape = shape.empty() ? nullptr : shape.data();
    const std::string given = "'" + activation + "'";
    n.activation_arg = activation_arg.c_str();
    n.activation_given = given.c_str();
    char text[1024];
    const int error = g_api->fault_text(&fault, &n, text, sizeof text);
    if (error == W8_ERROR_TYPE) TORCH_CHECK_TYPE(false, text);
    if (error == W8_ERROR_MEMORY) TORCH_CHECK(false, text);
    TORCH_CHECK_VALUE(false, text);
}

std::string dtype_name(at::ScalarType t) {
    return "torch." + std::string(c10::getDtypeNames(t).first);
}

// A layout as Python writes it.
std::string layout_name(at::Layout layout) {
    switch (layout) {
    case at::kSparse: return "torch.sparse_coo";
    case at::kSparseCsr: return "torch.sparse_csr";
    case at::kSparseCsc: return "torch.sparse_csc";
    case at::kSparseBsr: return "torch.sparse_bsr";
    case at::kSparseBsc: return "torch.sparse_bsc";
    case at::kMkldnn: return "torch._mkldnn";
    case at::kJagged: return "torch.jagged";
    default: return "torch.strided";
    }
}

std::string shape_text(const at::Tensor &t) {
    std::string s = "(";
    for (int64_t i = 0; i < t.dim(); i++)
        s += (i ? ", " : "") + std::to_string(t.size(i));
    return s + (t.dim() == 1 ? ",)" : ")");
}

// What a layer computes from: a dense CPU float32 or bfloat16 tensor of in_features
// features, no gradient to record.  Also the Python layers' check of what a graph being
// recorded sees (FakeTensors), so both say the same thing.
void check_input(const at::Tensor &x, int64_t in_features) {
    TORCH_CHECK_VALUE(x.device().is_cpu(), "x is on ", x.device(),
                      "; pyw8a8 layers run on the CPU (move the input with .cpu())");
    TORCH_CHECK_TYPE(!x.is_nested() && x.layout() == at::kStrided,
                     "x must be a dense (strided) tensor, got ",
                     x.is_nested() ? std::string("a nested tensor")
                                   : "layout " + layout_name(x.layout()),
                     " (convert it with .to_dense(), a nested one with .to_padded_tensor(0.0))");
    TORCH_CHECK_TYPE(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16,
                     "x must be float32 or bfloat16, got ", dtype_name(x.scalar_type()),
                     " (convert it with .float())");
    TORCH_CHECK_VALUE(x.dim() > 0, "x must have at least one dimension, got a scalar");
    if (x.size(-1) != in_features) {
        w8_fault fault{};
        fault.code = W8_FAULT_FEATURES;
        fault.a = x.size(-1);
        fault.b = in_features;
        raise_fault(fault, kLinearNames, &x, "activation", "");
    }
    if (x.requires_grad() && c10::GradMode::is_enabled())
        TORCH_CHECK(false, "x", kInferenceOnly);
}

struct WeightTensors {
    const at::Tensor &panels, &psum, &scales, &header;
};

void check_weight_tensor(const at::Tensor &t, const char *name, at::ScalarType dtype) {
    TORCH_CHECK_VALUE(t.device().is_cpu(), "packed weight ", name, " is on ", t.device(),
                      "; pyw8a8 runs on the CPU");
    TORCH_CHECK_VALUE(t.layout() == at::kStrided && t.is_contiguous() &&
                          t.scalar_type() == dtype,
                      "packed weight ", name, " must be a contiguous ", dtype_name(dtype),
                      " tensor, got ", dtype_name(t.scalar_type()), " ", shape_text(t));
}

// A weight's plan, the core's, freed with it; where the core read the panels from a copy
// of its own, the storage they came from, so that another tensor at a freed one's
// address is not taken for it.
struct Plan {
    w8_plan *plan = nullptr;
    std::optional<c10::weak_intrusive_ptr<c10::StorageImpl>> panels_storage;
    const c10::StorageImpl *panels_storage_id = nullptr;

    ~Plan() {
        if (plan) g_api->plan_free(plan);
    }
    bool holds(const at::Tensor &panels) const {
        return !panels_storage || (!panels_storage->expired() &&
                                   panels_storage_id == panels.storage().unsafeGetStorageImpl());
    }
};

// The key of a weight: the panels', sums' and scales' addresses, sizes and version
// counters, and the header's values (not the header tensor itself, which Inductor's
// freezing materializes anew on every call).  An inference tensor has no version counter:
// the header's values stand in, and its panels are read in place (a copy could go stale).
using Key = std::array<int64_t, 9 + W8_HEADER_FIELDS>;

struct KeyHash {
    size_t operator()(const Key &k) const {
        uint64_t h = 1469598103934665603ull;
        for (int64_t v : k) h = (h ^ static_cast<uint64_t>(v)) * 1099511628211ull;
        return static_cast<size_t>(h);
    }
};

// One lock over the map, held for lookups and inserts only.  A fork while another
// thread holds it would leave it locked in the child: pthread_atfork takes it around
// the fork.
std::mutex g_lock;
std::unordered_map<Key, std::shared_ptr<Plan>, KeyHash> g_plans;

Key weight_key(const WeightTensors &w) {
    const at::Tensor *parts[3] = {&w.panels, &w.psum, &w.scales};
    Key key{};
    for (int i = 0; i < 3; i++) {
        const at::Tensor &t = *parts[i];
        key[i] = reinterpret_cast<int64_t>(t.data_ptr());
        key[3 + i] = t.numel();
        key[6 + i] = t.is_inference() ? -1 : static_cast<int64_t>(t._version());
    }
    const int64_t *h = w.header.data_ptr<int64_t>();
    for (int i = 0; i < W8_HEADER_FIELDS; i++) key[9 + i] = h[i];
    return key;
}

std::shared_ptr<Plan> new_plan(const WeightTensors &w, const char *name) {
    check_weight_tensor(w.psum, "psum", at::kInt);  // (plan_of checked the others)
    check_weight_tensor(w.scales, "scales", at::kFloat);
    const int64_t *v = w.header.data_ptr<int64_t>();
    const w8_weight_header header{v[0], v[1], v[2], v[3], v[4], v[5], v[6]};
    const w8_weight_arrays arrays{static_cast<const uint8_t *>(w.panels.data_ptr()),
                                  w.panels.numel(), w.psum.data_ptr<int32_t>(),
                                  w.psum.numel(), w.scales.data_ptr<float>(),
                                  w.scales.numel()};
    const bool copy = !w.panels.is_inference();
    w8_fault fault{};
    auto plan = std::make_shared<Plan>();
    plan->plan = g_api->plan_new(&header, &arrays,
                                 W8_PLAN_CHECK_CONTENTS | (copy ? W8_PLAN_ALIGNED_COPY : 0),
                                 &fault);
    if (plan->plan == nullptr) {
        const char *names[W8_ARG_COUNT] = {"x", name, name, "bias", "bias"};
        raise_fault(fault, names, nullptr, "activation", "");
    }
    if (copy && reinterpret_cast<uintptr_t>(w.panels.data_ptr()) % 64) {
        plan->panels_storage.emplace(w.panels.storage().getWeakStorageImpl());
        plan->panels_storage_id = w.panels.storage().unsafeGetStorageImpl();
    }
    return plan;
}

// The plan of a weight's tensors: the one made for them before, or a new one, checked.
std::shared_ptr<Plan> plan_of(const WeightTensors &w, const char *name) {
    TORCH_CHECK_VALUE(w.header.device().is_cpu() && w.header.scalar_type() == at::kLong &&
                          w.header.is_contiguous() && w.header.numel() == W8_HEADER_FIELDS,
                      "packed weight header must be a contiguous CPU int64 tensor of ",
                      W8_HEADER_FIELDS, " values, got ", shape_text(w.header));
    check_weight_tensor(w.panels, "panels", at::kByte);
    const Key key = weight_key(w);
    {
        std::lock_guard<std::mutex> guard(g_lock);
        auto it = g_plans.find(key);
        if (it != g_plans.end()) {
            if (it->second->holds(w.panels)) return it->second;
            g_plans.erase(it);  // another tensor at a freed one's address
        }
    }
    std::shared_ptr<Plan> plan = new_plan(w, name);
    std::lock_guard<std::mutex> guard(g_lock);
    if (g_plans.size() >= kMaxPlans) g_plans.clear();  // weights come and go: start anew
    g_plans[key] = plan;
    return plan;
}

// `t` as float32 values in C order (bfloat16 widened exactly, a negative view's values
// read, any strides copied); `t` itself where it is that already, with no dispatcher call
// (each costs a few tenths of a microsecond, a tenth of a one-row product).
at::Tensor float_values(const at::Tensor &t) {
    at::Tensor v = t.scalar_type() == at::kFloat ? t : t.to(at::kFloat);
    if (v.is_neg()) v = v.resolve_neg();
    return v.is_contiguous() ? v : v.contiguous();
}

// A bias as the core reads it: N float32 values, contiguous (its values the core checks).
at::Tensor bias_values(const c10::optional<at::Tensor> &bias, int64_t n, const char *name) {
    if (!bias.has_value() || !bias->defined()) return at::Tensor();
    const at::Tensor &b = *bias;
    TORCH_CHECK_VALUE(b.device().is_cpu(), name, " is on ", b.device(),
                      "; pyw8a8 runs on the CPU");
    TORCH_CHECK_VALUE(b.is_floating_point(), name, " must be a floating-point tensor, got ",
                      dtype_name(b.scalar_type()));
    TORCH_CHECK_VALUE(b.dim() == 1 && b.size(0) == n, name, " must have shape (", n,
                      ",) (one value per output channel), got ", shape_text(b));
    return float_values(b);
}

// A float32 output of `shape`, its memory the core's kept output memory where large.
at::Tensor output_tensor(const std::vector<int64_t> &shape, const at::TensorOptions &options) {
    size_t n = sizeof(float);
    for (int64_t d : shape) n *= static_cast<size_t>(d);
    if (n < kPooledFromBytes) return at::empty(shape, options);
    size_t size = 0;
    void *p = g_api->output_take(n, &size);
    TORCH_CHECK(p != nullptr, "no memory for a ", n, "-byte output");
    const w8_call_api *api = g_api;
    return at::from_blob(p, shape, [api, size](void *q) { api->output_give(q, size); },
                         options);
}

// What a call of the operators takes, checked: its plans, biases and activation.
struct Operands {
    const char *const *names;  // the arguments' names in messages, W8_ARG_* order
    std::string activation, activation_arg;
    std::shared_ptr<Plan> plans[2];
    at::Tensor bias[2];
    w8_call call{};
};

void set_operands(Operands &o, int kind, const at::Tensor &x, const WeightTensors *weights,
                  const c10::optional<at::Tensor> *biases) {
    TORCH_CHECK(g_api != nullptr, "pyw8a8's core is not bound (import pyw8a8.torch)");
    o.names = kind == W8_CALL_ONE ? kLinearNames : kGatedNames;
    o.activation_arg = kind == W8_CALL_ONE ? "activation" : "glu";
    const int nw = kind == W8_CALL_ONE ? 1 : 2;
    for (int j = 0; j < nw; j++) o.plans[j] = plan_of(weights[j], o.names[W8_ARG_W1 + j]);
    check_input(x, weights[0].header.data_ptr<int64_t>()[2]);
    o.call.kind = kind;
    o.call.act = g_api->activation_code(o.activation.c_str());
    if (o.call.act < 0 || (kind == W8_CALL_GLU && o.call.act == 0)) {
        w8_fault fault{};
        fault.code = W8_FAULT_ACTIVATION;
        raise_fault(fault, o.names, &x, o.activation_arg, o.activation);
    }
    for (int j = 0; j < nw; j++) {
        o.call.plan[j] = o.plans[j]->plan;
        o.bias[j] = bias_values(biases[j], g_api->plan_outputs(o.plans[j]->plan),
                                o.names[W8_ARG_B1 + j]);
        o.call.bias[j] = o.bias[j].defined() ? o.bias[j].data_ptr<float>() : nullptr;
    }
}

at::Tensor product(int kind, const at::Tensor &x, const WeightTensors *weights,
                   const c10::optional<at::Tensor> *biases, c10::string_view activation) {
    Operands o;
    o.activation = std::string(activation);
    set_operands(o, kind, x, weights, biases);
    const at::Tensor rows = float_values(x);  // as numpy would hand them to matmul
    const int64_t N = g_api->plan_outputs(o.plans[0]->plan);
    std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
    shape.back() = N;
    int64_t M = 1;
    for (size_t i = 0; i + 1 < shape.size(); i++) M *= shape[i];
    at::Tensor out = output_tensor(shape, x.options().dtype(at::kFloat));
    w8_call &call = o.call;
    call.x = rows.data_ptr<float>();
    call.M = M;
    call.K = x.size(-1);
    call.out[0] = out.data_ptr<float>();
    call.ldo[0] = N;
    call.out_size = sizeof(float);
    const int64_t work = M * call.K * N * (kind == W8_CALL_ONE ? 1 : 2);
    g_api->place(M, work, at::get_num_threads(), &call.isa, &call.nthreads);
    w8_fault fault{};
    int code;
    {
        // Called from Python, the dispatcher may still hold the GIL: the product never
        // needs it.
        std::unique_ptr<py::gil_scoped_release> release;
        if (Py_IsInitialized() && PyGILState_Check())
            release = std::make_unique<py::gil_scoped_release>();
        code = g_api->run(&call, &fault);
    }
    if (code != W8_FAULT_NONE) raise_fault(fault, o.names, &x, o.activation_arg, o.activation);
    g_calls.fetch_add(1, std::memory_order_relaxed);
    return x.scalar_type() == at::kFloat ? out : out.to(x.scalar_type());
}

at::Tensor linear(const at::Tensor &x, const at::Tensor &panels, const at::Tensor &psum,
                  const at::Tensor &scales, const at::Tensor &header,
                  const c10::optional<at::Tensor> &bias, c10::string_view activation) {
    WeightTensors w[1] = {{panels, psum, scales, header}};
    c10::optional<at::Tensor> b[1] = {bias};
    return product(W8_CALL_ONE, x, w, b, activation);
}

at::Tensor gated_linear(const at::Tensor &x, const at::Tensor &panels1,
                        const at::Tensor &psum1, const at::Tensor &scales1,
                        const at::Tensor &header1, const at::Tensor &panels2,
                        const at::Tensor &psum2, const at::Tensor &scales2,
                        const at::Tensor &header2, const c10::optional<at::Tensor> &bias1,
                        const c10::optional<at::Tensor> &bias2, c10::string_view glu) {
    WeightTensors w[2] = {{panels1, psum1, scales1, header1},
                          {panels2, psum2, scales2, header2}};
    c10::optional<at::Tensor> b[2] = {bias1, bias2};
    return product(W8_CALL_GLU, x, w, b, glu);
}

// The eager layers' entries: each operator called through the dispatcher from here, so
// that a layer's call crosses from Python by pybind, not by torch.ops' generic binding
// (its argument parsing and checks cost 1.6 us a call: 2.5 us against 0.9 us from C++ at
// 1 x 64 x 64).  The dispatcher still runs whatever a call meets there: the profiler's
// record, dispatch modes.
at::Tensor eager_linear(const at::Tensor &x, const at::Tensor &panels, const at::Tensor &psum,
                        const at::Tensor &scales, const at::Tensor &header,
                        const c10::optional<at::Tensor> &bias, const std::string &activation) {
    static const auto op = c10::Dispatcher::singleton()
                               .findSchemaOrThrow("pyw8a8::linear", "")
                               .typed<decltype(linear)>();
    return op.call(x, panels, psum, scales, header, bias, activation);
}

at::Tensor eager_gated_linear(const at::Tensor &x, const at::Tensor &panels1,
                              const at::Tensor &psum1, const at::Tensor &scales1,
                              const at::Tensor &header1, const at::Tensor &panels2,
                              const at::Tensor &psum2, const at::Tensor &scales2,
                              const at::Tensor &header2, const c10::optional<at::Tensor> &bias1,
                              const c10::optional<at::Tensor> &bias2, const std::string &glu) {
    static const auto op = c10::Dispatcher::singleton()
                               .findSchemaOrThrow("pyw8a8::gated_linear", "")
                               .typed<decltype(gated_linear)>();
    return op.call(x, panels1, psum1, scales1, header1, panels2, psum2, scales2, header2,
                   bias1, bias2, glu);
}

// Binds the core's call table; "" if all is well, else why not.
std::string bind(py::capsule api) {
    auto *table = static_cast<const w8_call_api *>(api.get_pointer());
    if (table == nullptr || std::string(api.name()) != W8_CALL_CAPSULE)
        return "the core's capsule is not pyw8a8's call table";
    if (table->abi_version != W8_CALL_ABI_VERSION)
        return "the core's call table is version " + std::to_string(table->abi_version) +
               ", this operator was built for " + std::to_string(W8_CALL_ABI_VERSION);
    static std::once_flag atfork;
    std::call_once(atfork, [] {
        pthread_atfork([] { g_lock.lock(); }, [] { g_lock.unlock(); }, [] { g_lock.unlock(); });
    });
    g_api = table;
    return "";
}

int64_t calls() { return g_calls.load(); }

}  // namespace

TORCH_LIBRARY_IMPL(pyw8a8, CPU, m) {
    m.impl("linear", &linear);
    m.impl("gated_linear", &gated_linear);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("bind", &bind, "Bind the core's call table (_kernels.CALL_API).");
    m.def("linear", &eager_linear, "torch.ops.pyw8a8.linear, entered from C++.");
    m.def("gated_linear", &eager_gated_linear,
          "torch.ops.pyw8a8.gated_linear, entered from C++.");
    m.def("check_input", &check_input, "The operators' check of an input x.");
    m.def("calls", &calls, "How many products the operators ran.");
}
