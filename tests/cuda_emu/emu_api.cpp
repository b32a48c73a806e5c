// Exported controls of the CUDA emulation for tests that call the emulated kernels through ctypes:
// run what is still queued (launches are deferred by one, cuda_runtime.h), and change the device
// the emulation pretends to be (compute capability, SM count).
#include <cuda_runtime.h>

extern "C" void moespec_emu_synchronize() { cudaDeviceSynchronize(); }

extern "C" void moespec_emu_set_device(int cc_major, int cc_minor, int sms) {
  emu::flush();
  emu::st().cc_major = cc_major;
  emu::st().cc_minor = cc_minor;
  emu::st().sms = sms;
}
