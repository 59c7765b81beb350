#include "probe/device_probe.h"

#include "common/error.h"

namespace spillway {

DeviceProbeShape device_probe_shape(const ModelSpec& model) {
    DeviceProbeShape s;
    s.n_layer = model.n_layer;
    if (!model.layers.empty()) {
        s.n_head = model.layers[0].n_head;
        s.n_head_kv = model.layers[0].n_head_kv;
    }
    s.head_dim = model.head_dim_k;
    return s;
}

#ifndef SPILLWAY_HAVE_CUDA
bool cuda_device_available() { return false; }
GpuIdentity gpu_identity() { fail("this spillway was built without CUDA: no GPU to identify"); }
double measure_vram_read_gbps() { fail("this spillway was built without CUDA: no GPU to measure"); }
double measure_pinned_h2d_gbps() { fail("this spillway was built without CUDA: no GPU to measure"); }
ProbeValues measure_device_probe(const DeviceProbeShape&) {
    fail("this spillway was built without CUDA: device probes need a CUDA build and a GPU "
         "(use --profile FILE or the --vram-bw-gbps/--pcie-gbps/--c-engage-ms overrides instead)");
}
#endif

}  // namespace spillway
