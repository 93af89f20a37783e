// Host runtime of the CUDA simulator (see sim.h): the generated translation unit is
//   #include "sim.h"; <the kernel module source>; #include "runtime.cpp"; SIM_KERNEL(name) lines; SIM_END
// and exports sim_launch(name, grid, block, dynamic shared bytes, kernelParams, error buffer), with
// kernelParams as for cuLaunchKernel (an array of pointers to the argument values).
#include <utility>

namespace sim {
template <class... A, size_t... I>
void invoke_impl(void (*f)(A...), void** args, std::index_sequence<I...>) {
    f(*static_cast<A*>(args[I])...);
}
template <class... A>
void invoke(void (*f)(A...), void** args) {
    invoke_impl(f, args, std::index_sequence_for<A...>{});
}
struct Entry {
    const char* name;
    void (*call)(void**);
};
}  // namespace sim

#define SIM_KERNEL(k) {#k, [](void** a) { sim::invoke(&k, a); }},
#define SIM_BEGIN static const sim::Entry SIM_TABLE[] = {
#define SIM_END                                                                                        \
    {nullptr, nullptr}};                                                                               \
    extern "C" int sim_launch(const char* name, unsigned gx, unsigned gy, unsigned gz, unsigned block,  \
                              unsigned smem, void** args, char* err, unsigned errlen) {                \
        return sim::launch_table(SIM_TABLE, name, gx, gy, gz, block, smem, args, err, errlen);         \
    }

namespace sim {
inline int launch_table(const Entry* table, const char* name, unsigned gx, unsigned gy, unsigned gz,
                        unsigned block, unsigned smem, void** args, char* err, unsigned errlen) {
    const Entry* e = table;
    while (e->name && std::strcmp(e->name, name) != 0) ++e;
    auto report = [&](const std::string& m) {
        if (errlen) std::snprintf(err, errlen, "%s", m.c_str());
        return 1;
    };
    if (!e->name) return report(std::string("no kernel named ") + name);
    if (block == 0 || block > 1024) return report("block size out of range");
    error.clear();
    dyn_bytes = smem;
    gridDim = dim3{gx, gy, gz};
    blockDim = dim3{block, 1, 1};
    body = [e, args]() { e->call(args); };
    std::vector<dim3> all;
    for (unsigned z = 0; z < gz; ++z)
        for (unsigned y = 0; y < gy; ++y)
            for (unsigned x = 0; x < gx; ++x) all.push_back(dim3{x, y, z});
    // Cooperative kernels (grid barriers) run every block at once; the others one block at a time.
    const bool cooperative = std::strncmp(name, "gemv_segment", 12) == 0;
    if (cooperative) {
        if (!run_blocks(all) || !error.empty()) return report(std::string(name) + " (all blocks): " + error);
        return 0;
    }
    for (const dim3& b : all) {
        if (!run_blocks({b}) || !error.empty()) {
            return report(std::string(name) + " block (" + std::to_string(b.x) + "," + std::to_string(b.y) + "," +
                          std::to_string(b.z) + "): " + error);
        }
    }
    return 0;
}
}  // namespace sim
SIM_BEGIN
