// The CPU kernels of torch.ops.pyw8a8.linear and gated_linear: pyw8a8's product called
// straight from the dispatcher, with no Python and no numpy in between; and the eager
// layers' entries into those operators (eager_linear, eager_gated_linear).
//
// The schemas are defined in Python (pyw8a8/torch/_ops.py); this library registers their
// CPU kernels.  It reaches the product through the core's native interface
// (_simd/native_api.h, the capsule pyw8a8._kernels.NATIVE_API), so it is built against the
// installed torch alone and never ties the core to a torch version.
//
// A call runs here, without the GIL, when everything it needs is known:
//   - the weight's plan (its C half: the arrays' memory, sizes and rotation), kept per
//     weight under a key of the four tensors' addresses, sizes and version counters and
//     the header's values, so a plan is a function of its key alone;
//   - a blocking the tuner settled for this call's rows, ISA and threads (its generation
//     of the process's settings), remembered on the plan;
//   - an input the compiled call takes: float32 or bfloat16, on the CPU, dense, K features,
//     finite rows, no gradient to record, a finite float32 bias of N values.
// Anything else takes the Python route (pyw8a8.torch._native.python_call) under the GIL:
// it checks and raises exactly as the Python operator does, tunes the shape, and hands
// back the plan and the blocking once settled.
#include <torch/extension.h>

#include <ATen/Parallel.h>
#include <c10/core/GradMode.h>
#include <pthread.h>

#include <array>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "native_api.h"

namespace py = pybind11;

namespace {

constexpr int kCallKinds = 3;     // _kernels.CALL_ONE, CALL_PAIR, CALL_GLU
constexpr int kCallOne = 0;
constexpr int kCallGlu = 2;
constexpr int kSettledSlots = 8;  // row counts remembered per weight and kind
constexpr size_t kMaxPlans = 4096;

const w8_native_api *g_api = nullptr;
std::unordered_map<std::string, int> g_activations;  // _kernels.ACTIVATIONS, and "" -> 0
std::atomic<int64_t> g_native_calls{0}, g_python_calls{0};

struct Slot {
    uint64_t generation = 0;
    const void *isa = nullptr;
    int64_t rows = -1;
    int nthreads = 0;
    w8_blocking blocking{};
};

struct Plan {
    w8_weight_desc desc{};
    std::vector<float> signs;  // the plan's own copy of the rotation's sign table
    // Panels not on a 64-byte boundary (an AOTInductor package's constants, 16-byte
    // aligned) are read from an aligned copy, as PackedWeight.plan does: every kernel load
    // of them is then one cache line.  The copy is the plan's while the tensor's storage
    // is the same one, alive (the key's address alone could be a new tensor's).
    std::unique_ptr<uint8_t, decltype(&std::free)> panels_copy{nullptr, &std::free};
    std::optional<c10::weak_intrusive_ptr<c10::StorageImpl>> panels_storage;
    const c10::StorageImpl *panels_storage_id = nullptr;
    Slot slots[kCallKinds][kSettledSlots];
    int next[kCallKinds] = {0, 0, 0};

    bool holds(const at::Tensor &panels) const {
        return !panels_copy || (!panels_storage->expired() &&
                                panels_storage_id == panels.storage().unsafeGetStorageImpl());
    }
};

// The panels', sums' and scales' addresses, sizes and version counters, and the header's
// values (_ops.HEADER_FIELDS): not the header tensor itself, which Inductor's freezing
// materializes anew on every call.
constexpr int kHeaderFields = 7;
using Key = std::array<int64_t, 9 + kHeaderFields>;

struct KeyHash {
    size_t operator()(const Key &k) const {
        uint64_t h = 1469598103934665603ull;
        for (int64_t v : k) h = (h ^ static_cast<uint64_t>(v)) * 1099511628211ull;
        return static_cast<size_t>(h);
    }
};

// One lock over the plans and their slots, held for lookups and copies only.  A fork
// while another thread holds it would leave it locked in the child: pthread_atfork takes
// it around the fork.
std::mutex g_lock;
std::unordered_map<Key, std::shared_ptr<Plan>, KeyHash> g_plans;

struct WeightTensors {
    const at::Tensor &panels, &psum, &scales, &header;
};

// The key of a weight, or false where its tensors are not what a plan is kept for
// (the Python route then checks them and says what is wrong).
bool weight_key(const WeightTensors &w, Key *key) {
    const at::Tensor *parts[4] = {&w.panels, &w.psum, &w.scales, &w.header};
    for (int i = 0; i < 4; i++) {
        const at::Tensor &t = *parts[i];
        if (!t.defined() || !t.device().is_cpu() || t.layout() != at::kStrided ||
            !t.is_contiguous())
            return false;
        if (i == 3) break;
        (*key)[i] = reinterpret_cast<int64_t>(t.data_ptr());
        (*key)[3 + i] = t.numel();
        // An inference tensor has no version counter: the header's values stand in.
        (*key)[6 + i] = t.is_inference() ? -1 : static_cast<int64_t>(t._version());
    }
    if (w.header.scalar_type() != at::kLong || w.header.numel() != kHeaderFields) return false;
    const int64_t *h = w.header.data_ptr<int64_t>();
    for (int i = 0; i < kHeaderFields; i++) (*key)[9 + i] = h[i];
    return true;
}

std::shared_ptr<Plan> find_plan(const Key &key, const at::Tensor &panels) {
    std::lock_guard<std::mutex> guard(g_lock);
    auto it = g_plans.find(key);
    if (it == g_plans.end()) return nullptr;
    if (!it->second->holds(panels)) {  // another tensor at a freed one's address
        g_plans.erase(it);
        return nullptr;
    }
    return it->second;
}

bool find_blocking(const Plan &plan, int kind, const w8_call_place &place, int64_t rows,
                   w8_blocking *out) {
    std::lock_guard<std::mutex> guard(g_lock);
    for (const Slot &s : plan.slots[kind])
        if (s.rows == rows && s.isa == place.isa && s.nthreads == place.nthreads &&
            s.generation == place.generation) {
            *out = s.blocking;
            return true;
        }
    return false;
}

// Remember what the Python route learned: the plan of each weight (copied from its
// WeightPlan's C half, whose arrays are the tensors' memory) and the settled blocking.
bool remember(const Key *keys, const WeightTensors *weights, const py::tuple &plans, int nw,
              int kind, const w8_call_place &place, int64_t rows, const py::tuple &blocking) {
    std::shared_ptr<Plan> made[2];
    for (int j = 0; j < nw; j++) {
        auto *desc = reinterpret_cast<const w8_weight_desc *>(plans[j].cast<uintptr_t>());
        auto plan = std::make_shared<Plan>();
        plan->desc = *desc;
        if (desc->signs) {
            plan->signs.assign(desc->signs, desc->signs + desc->K);
            plan->desc.signs = plan->signs.data();
        }
        const at::Tensor &panels = weights[j].panels;
        if (desc->panels != panels.data_ptr()) {  // PackedWeight.plan read an aligned copy
            // An inference tensor has no version counter to tell a write in place: its
            // own memory is read, unaligned, rather than a copy that could go stale.
            if (panels.is_inference()) {
                plan->desc.panels = static_cast<const uint8_t *>(panels.data_ptr());
            } else {
                void *copy = nullptr;
                const size_t bytes = static_cast<size_t>(panels.nbytes());
                if (posix_memalign(&copy, 64, bytes ? bytes : 64) != 0) return false;
                std::memcpy(copy, panels.data_ptr(), bytes);
                plan->panels_copy.reset(static_cast<uint8_t *>(copy));
                plan->panels_storage.emplace(panels.storage().getWeakStorageImpl());
                plan->panels_storage_id = panels.storage().unsafeGetStorageImpl();
                plan->desc.panels = plan->panels_copy.get();
            }
        }
        made[j] = std::move(plan);
    }
    w8_blocking b{blocking[0].cast<int64_t>(), blocking[1].cast<int64_t>(),
                  blocking[2].cast<int64_t>(), blocking[3].cast<int64_t>(),
                  blocking[4].cast<int64_t>()};
    std::lock_guard<std::mutex> guard(g_lock);
    if (g_plans.size() + nw > kMaxPlans) g_plans.clear();  // weights come and go: start anew
    for (int j = 0; j < nw; j++) g_plans.emplace(keys[j], made[j]);
    // A gated pair's blocking is the gate's (one loop nest), as in the Python route.
    Plan &plan = *g_plans[keys[0]];
    int slot = -1;
    for (int s = 0; s < kSettledSlots; s++)
        if (plan.slots[kind][s].rows == rows && plan.slots[kind][s].isa == place.isa &&
            plan.slots[kind][s].nthreads == place.nthreads)
            slot = s;
    if (slot < 0) {
        slot = plan.next[kind];
        plan.next[kind] = (slot + 1) % kSettledSlots;
    }
    plan.slots[kind][slot] = Slot{place.generation, place.isa, rows, place.nthreads, b};
    return true;
}

// The scratch of the calling thread's native calls, grown as needed, freed with the thread.
struct Scratch {
    void *data = nullptr;
    size_t size = 0;
    void *reserve(size_t n) {
        if (n > size) {
            void *p = nullptr;
            if (posix_memalign(&p, 64, n) != 0) return nullptr;
            std::free(data);
            data = p;
            size = n;
        }
        return data;
    }
    ~Scratch() { std::free(data); }
};
thread_local Scratch t_scratch;

// The memory of large outputs.  A model's layers free and allocate outputs of the same few
// shapes call after call; glibc hands each one from 128 KiB on back to the system when
// freed, so at::empty's next output comes as fresh pages, faulted and zeroed on the
// product's first write: 1 x 64 x 1152 x 6912 cost 182 us over its product that way
// against 111 us on the Python operator, whose outputs (pyw8a8._outputs) are kept the
// same way as here.  A freed output of kPooledFromBytes or more is kept (at most
// kPooledBuffers of them, kPooledBytes in all) for the next output of n to 2n bytes.
constexpr size_t kPooledFromBytes = 64 * 1024;
constexpr size_t kPooledBuffers = 8;
constexpr size_t kPooledBytes = size_t(1) << 28;

struct OutputPool {
    std::mutex lock;
    std::vector<std::pair<void *, size_t>> kept;  // (memory, its size), newest last
    size_t kept_bytes = 0;

    // Memory for n bytes, 64-byte aligned, and its size in *size; nullptr if none.
    void *take(size_t n, size_t *size) {
        {
            std::lock_guard<std::mutex> guard(lock);
            for (size_t i = kept.size(); i-- > 0;) {
                if (n <= kept[i].second && kept[i].second <= 2 * n) {
                    void *p = kept[i].first;
                    *size = kept[i].second;
                    kept_bytes -= *size;
                    kept.erase(kept.begin() + static_cast<std::ptrdiff_t>(i));
                    return p;
                }
            }
        }
        void *p = nullptr;
        if (posix_memalign(&p, 64, n) != 0) return nullptr;
        *size = n;
        return p;
    }
    // Keeps freed memory, dropping the oldest kept where over the limits.
    void give(void *p, size_t size) {
        std::vector<void *> dropped;
        {
            std::lock_guard<std::mutex> guard(lock);
            kept.emplace_back(p, size);
            kept_bytes += size;
            while (kept.size() > kPooledBuffers || kept_bytes > kPooledBytes) {
                dropped.push_back(kept.front().first);
                kept_bytes -= kept.front().second;
                kept.erase(kept.begin());
            }
        }
        for (void *q : dropped) std::free(q);
    }
};
// Never destroyed: an output may outlive the library's static objects.
OutputPool &g_outputs = *new OutputPool;

// A float32 output of `shape`, its memory from g_outputs where large.
at::Tensor output_tensor(const std::vector<int64_t> &shape, const at::TensorOptions &options) {
    size_t n = sizeof(float);
    for (int64_t d : shape) n *= static_cast<size_t>(d);
    if (n < kPooledFromBytes) return at::empty(shape, options);
    size_t size = 0;
    void *p = g_outputs.take(n, &size);
    if (p == nullptr) return at::empty(shape, options);
    return at::from_blob(p, shape, [size](void *q) { g_outputs.give(q, size); }, options);
}

bool finite_bias(const c10::optional<at::Tensor> &bias, int64_t n, const float **data) {
    *data = nullptr;
    if (!bias.has_value() || !bias->defined()) return true;
    const at::Tensor &b = *bias;
    if (!b.device().is_cpu() || b.scalar_type() != at::kFloat || b.dim() != 1 ||
        b.numel() != n || !b.is_contiguous() || b.is_neg())
        return false;
    const float *p = b.data_ptr<float>();
    for (int64_t i = 0; i < n; i++)
        if (!std::isfinite(p[i])) return false;
    *data = p;
    return true;
}

// The product on the native path, or an undefined tensor where the call is not one it
// takes (the caller then takes the Python route).
at::Tensor native_product(int kind, const at::Tensor &x, const WeightTensors *weights,
                          const c10::optional<at::Tensor> *biases, int nw, int act,
                          const Key *keys, w8_call_place *place, bool *placed) {
    *placed = false;
    if (g_api == nullptr || !x.defined() || !x.device().is_cpu() ||
        x.layout() != at::kStrided || x.is_nested() || x.dim() == 0 ||
        (x.scalar_type() != at::kFloat && x.scalar_type() != at::kBFloat16) ||
        (x.requires_grad() && c10::GradMode::is_enabled()))
        return at::Tensor();
    const int64_t K = x.size(-1);
    if (x.numel() == 0 || K != weights[0].header.data_ptr<int64_t>()[2]) return at::Tensor();
    const int64_t M = x.numel() / K;
    const int64_t N = weights[0].scales.numel();
    if (g_api->call_place(M, M * K * N * nw, at::get_num_threads(), place) != 0)
        return at::Tensor();
    *placed = true;  // from here the Python route may hand back what it settles
    std::shared_ptr<Plan> plans[2];
    w8_native_call call{};
    for (int j = 0; j < nw; j++) {
        if (!(plans[j] = find_plan(keys[j], weights[j].panels))) return at::Tensor();
        call.w[j] = &plans[j]->desc;
        if (!finite_bias(biases[j], plans[j]->desc.N, &call.bias[j])) return at::Tensor();
    }
    if (!find_blocking(*plans[0], kind, *place, M, &call.blocking)) return at::Tensor();
    // float32 rows in C order, as numpy would hand them to matmul (bfloat16 widened
    // exactly, a negative view's values read, any strides copied).
    at::Tensor rows = x.scalar_type() == at::kFloat ? x : x.to(at::kFloat);
    rows = rows.resolve_neg().contiguous();
    std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
    shape.back() = N;
    at::Tensor out = output_tensor(shape, x.options().dtype(at::kFloat));
    call.x = rows.data_ptr<float>();
    call.M = M;
    call.K = K;
    call.nw = nw;
    call.glu = kind == kCallGlu;
    call.act = act;
    call.out = out.data_ptr<float>();
    void *scratch = t_scratch.reserve(g_api->scratch_bytes(&call, place));
    if (scratch == nullptr) return at::Tensor();
    int64_t bad;
    {
        // Called from Python, the dispatcher may still hold the GIL: the product never
        // needs it.
        std::unique_ptr<py::gil_scoped_release> release;
        if (Py_IsInitialized() && PyGILState_Check())
            release = std::make_unique<py::gil_scoped_release>();
        bad = g_api->run(&call, place, scratch);
    }
    if (bad >= 0) return at::Tensor();  // a row holding NaN/Inf: the Python route says which
    g_native_calls.fetch_add(1, std::memory_order_relaxed);
    return x.scalar_type() == at::kFloat ? out : out.to(x.scalar_type());
}

py::object python_route() {
    return py::module_::import("pyw8a8.torch._native").attr("python_call");
}

at::Tensor product(int kind, const at::Tensor &x, const WeightTensors *weights,
                   const c10::optional<at::Tensor> *biases, int nw,
                   c10::string_view activation) {
    Key keys[2];
    bool keyed = true;
    for (int j = 0; j < nw; j++) keyed = keyed && weight_key(weights[j], &keys[j]);
    auto act = g_activations.find(std::string(activation));
    w8_call_place place{};
    bool placed = false;
    if (keyed && act != g_activations.end()) {
        at::Tensor y = native_product(kind, x, weights, biases, nw, act->second, keys, &place,
                                      &placed);
        if (y.defined()) return y;
    }
    g_python_calls.fetch_add(1, std::memory_order_relaxed);
    py::gil_scoped_acquire gil;
    py::list tensors;
    for (int j = 0; j < nw; j++)
        tensors.append(py::make_tuple(weights[j].panels, weights[j].psum, weights[j].scales,
                                      weights[j].header));
    py::list bias_list;
    for (int j = 0; j < nw; j++)
        bias_list.append(biases[j].has_value() ? py::cast(*biases[j]) : py::none());
    // (y, None) or (y, (plan addresses, blocking)) once the shape is settled for `place`.
    py::tuple result = python_route()(kind, x, tensors, bias_list, std::string(activation),
                                      placed ? py::cast(place.generation) : py::none(),
                                      placed ? py::cast(place.nthreads) : py::none());
    at::Tensor y = result[0].cast<at::Tensor>();
    if (keyed && placed && !result[1].is_none()) {
        py::tuple learned = result[1].cast<py::tuple>();
        remember(keys, weights, learned[0].cast<py::tuple>(), nw, kind, place,
                 x.numel() / x.size(-1), learned[1].cast<py::tuple>());
    }
    return y;
}

at::Tensor linear(const at::Tensor &x, const at::Tensor &panels, const at::Tensor &psum,
                  const at::Tensor &scales, const at::Tensor &header,
                  const c10::optional<at::Tensor> &bias, c10::string_view activation) {
    WeightTensors w[1] = {{panels, psum, scales, header}};
    c10::optional<at::Tensor> b[1] = {bias};
    return product(kCallOne, x, w, b, 1, activation);
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
    return product(kCallGlu, x, w, b, 2, glu);
}

// The eager layers' entries: each operator called through the dispatcher from here, so
// that a layer's call crosses from Python by pybind, not by torch.ops' generic binding
// (its argument parsing and checks cost 1.6 us a call: 2.5 us against 0.9 us from C++ at
// 1 x 64 x 64).  The dispatcher still runs whatever a call meets there: the profiler's
// record, dispatch modes, the Python route.
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

// Binds the core's native interface and the activation codes; "" if all is well, else
// why not (the layers then stay on the Python operator).
std::string bind(py::capsule api, py::dict activations) {
    auto *table = static_cast<const w8_native_api *>(api.get_pointer());
    if (table == nullptr || std::string(api.name()) != W8_NATIVE_CAPSULE)
        return "the core's capsule is not pyw8a8's native interface";
    if (table->abi_version != W8_NATIVE_ABI_VERSION)
        return "the core's native interface is version " + std::to_string(table->abi_version) +
               ", this operator was built for " + std::to_string(W8_NATIVE_ABI_VERSION);
    g_activations.clear();
    g_activations[""] = 0;
    for (auto item : activations)
        g_activations[item.first.cast<std::string>()] = item.second.cast<int>();
    static std::once_flag atfork;
    std::call_once(atfork, [] {
        pthread_atfork([] { g_lock.lock(); g_outputs.lock.lock(); },
                       [] { g_outputs.lock.unlock(); g_lock.unlock(); },
                       [] { g_outputs.lock.unlock(); g_lock.unlock(); });
    });
    g_api = table;
    return "";
}

py::dict counters() {
    py::dict d;
    d["native_calls"] = g_native_calls.load();
    d["python_calls"] = g_python_calls.load();
    {
        std::lock_guard<std::mutex> guard(g_lock);
        d["plans"] = g_plans.size();
    }
    std::lock_guard<std::mutex> guard(g_outputs.lock);
    d["outputs_kept_bytes"] = g_outputs.kept_bytes;
    return d;
}

void forget() {
    {
        std::lock_guard<std::mutex> guard(g_lock);
        g_plans.clear();
        g_native_calls = 0;
        g_python_calls = 0;
    }
    std::lock_guard<std::mutex> guard(g_outputs.lock);
    for (auto &kept : g_outputs.kept) std::free(kept.first);
    g_outputs.kept.clear();
    g_outputs.kept_bytes = 0;
}

}  // namespace

TORCH_LIBRARY_IMPL(pyw8a8, CPU, m) {
    m.impl("linear", &linear);
    m.impl("gated_linear", &gated_linear);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("bind", &bind, "Bind the core's native interface (_kernels.NATIVE_API).");
    m.def("linear", &eager_linear, "torch.ops.pyw8a8.linear, entered from C++.");
    m.def("gated_linear", &eager_gated_linear,
          "torch.ops.pyw8a8.gated_linear, entered from C++.");
    m.def("counters", &counters,
          "Calls taken natively and by the Python route; plans and freed output bytes kept.");
    m.def("forget", &forget, "Drop every kept plan and freed output, and zero the counters.");
}
