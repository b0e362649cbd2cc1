/* A job's view of the GPU through the CUDA driver API: how many devices it sees, which,
   and whether it can allocate MB megabytes (then holds them HOLD seconds). */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
static const char *err(CUresult r) { const char *s = "?"; cuGetErrorName(r, &s); return s; }
int main(int argc, char **argv) {
  size_t mb = argc > 1 ? strtoull(argv[1], 0, 10) : 64;
  int hold = argc > 2 ? atoi(argv[2]) : 0;
  CUresult r = cuInit(0);
  if (r != CUDA_SUCCESS) { printf("cuInit: %s\n", err(r)); return 3; }
  int n = 0; cuDeviceGetCount(&n); printf("devices=%d\n", n);
  for (int i = 0; i < n; i++) {
    CUdevice d; char name[128]; CUuuid u; int sms = 0;
    cuDeviceGet(&d, i); cuDeviceGetName(name, sizeof name, d); cuDeviceGetUuid(&u, d);
    cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, d);
    printf("device %d: %s uuid=GPU-", i, name);
    for (int k = 0; k < 16; k++) printf("%02x%s", (unsigned char)u.bytes[k], (k==3||k==5||k==7||k==9)?"-":"");
    printf(" sms=%d\n", sms);
  }
  if (n == 0) return 4;
  CUdevice d; CUcontext ctx; cuDeviceGet(&d, 0);
  r = cuDevicePrimaryCtxRetain(&ctx, d); if (r) { printf("ctx: %s\n", err(r)); return 5; }
  cuCtxSetCurrent(ctx);
  size_t fr = 0, tot = 0; cuMemGetInfo(&fr, &tot);
  printf("mem free=%zuMiB total=%zuMiB\n", fr >> 20, tot >> 20);
  CUdeviceptr p; r = cuMemAlloc(&p, mb << 20);
  printf("alloc %zuMiB: %s\n", mb, r == CUDA_SUCCESS ? "ok" : err(r));
  fflush(stdout);
  if (r == CUDA_SUCCESS && hold) sleep(hold);
  return r == CUDA_SUCCESS ? 0 : 2;
}
