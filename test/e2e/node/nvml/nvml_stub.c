/*
 * A stub libnvidia-ml.so.1 for the real-node e2e: the NVML calls pulse's
 * agent makes (pkg/gpu), answering for two GPUs with fixed values, so that
 * the agent's real path — go-nvml's dlopen of libnvidia-ml.so.1, then the
 * calls it resolves in it — runs on a machine with no GPU.
 *
 * Built by the test against go-nvml's own nvml.h (the ABI the agent is
 * compiled for; its nvmlDevice_t is a struct holding the handle):
 *   gcc -shared -fPIC -I<go-nvml>/pkg/nvml -o libnvidia-ml.so.1 nvml_stub.c
 *
 * GPU i has UUID STUB_UUID_PREFIX<i>, minor number i, utilization
 * STUB_UTIL[i] percent and 20 of 80 GiB memory used; MIG is not supported.
 * Every function the agent may call must be here: go-nvml resolves them
 * lazily, and one missing ends the agent ("symbol lookup error", exit 127).
 */
#include <stddef.h>
#include <string.h>
#include <time.h>

#include "nvml.h"

#define STUB_GPUS 2
#define STUB_UUID_PREFIX "GPU-5ca1ab1e-0000-4000-8000-00000000000"

static const unsigned int STUB_UTIL[STUB_GPUS] = {37, 81};

struct nvmlDevice_st {
  int index;
};

static struct nvmlDevice_st devices[STUB_GPUS] = {{0}, {1}};
static int initialized;

nvmlReturn_t nvmlInit_v2(void) {
  initialized = 1;
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlShutdown(void) {
  initialized = 0;
  return NVML_SUCCESS;
}

const char *nvmlErrorString(nvmlReturn_t result) {
  switch (result) {
  case NVML_SUCCESS:
    return "Success";
  case NVML_ERROR_UNINITIALIZED:
    return "Uninitialized";
  case NVML_ERROR_INVALID_ARGUMENT:
    return "Invalid Argument";
  case NVML_ERROR_NOT_SUPPORTED:
    return "Not Supported";
  case NVML_ERROR_INSUFFICIENT_SIZE:
    return "Insufficient Size";
  default:
    return "Unknown Error";
  }
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
  const char *v = "stub-550.0";
  if (version == NULL || length < strlen(v) + 1)
    return NVML_ERROR_INSUFFICIENT_SIZE;
  strcpy(version, v);
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
  if (!initialized)
    return NVML_ERROR_UNINITIALIZED;
  if (count == NULL)
    return NVML_ERROR_INVALID_ARGUMENT;
  *count = STUB_GPUS;
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
  if (!initialized)
    return NVML_ERROR_UNINITIALIZED;
  if (index >= STUB_GPUS || device == NULL)
    return NVML_ERROR_INVALID_ARGUMENT;
  device->handle = &devices[index];
  return NVML_SUCCESS;
}

/* go-nvml's nvml.h makes nvmlDevice_t a struct holding the handle. */
static int valid(nvmlDevice_t d) { return initialized && d.handle != NULL && d.handle->index >= 0 && d.handle->index < STUB_GPUS; }

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
  if (!valid(device))
    return NVML_ERROR_INVALID_ARGUMENT;
  if (uuid == NULL || length < sizeof(STUB_UUID_PREFIX) + 1)
    return NVML_ERROR_INSUFFICIENT_SIZE;
  memcpy(uuid, STUB_UUID_PREFIX, sizeof(STUB_UUID_PREFIX) - 1);
  uuid[sizeof(STUB_UUID_PREFIX) - 1] = (char)('0' + device.handle->index);
  uuid[sizeof(STUB_UUID_PREFIX)] = '\0';
  return NVML_SUCCESS;
}

/* One utilization sample per call, stamped now (microseconds). */
nvmlReturn_t nvmlDeviceGetSamples(nvmlDevice_t device, nvmlSamplingType_t type, unsigned long long lastSeen,
                                  nvmlValueType_t *valType, unsigned int *count, nvmlSample_t *samples) {
  if (!valid(device) || valType == NULL || count == NULL)
    return NVML_ERROR_INVALID_ARGUMENT;
  if (type != NVML_GPU_UTILIZATION_SAMPLES)
    return NVML_ERROR_NOT_SUPPORTED;
  *valType = NVML_VALUE_TYPE_UNSIGNED_INT;
  if (samples == NULL) {
    *count = 1;
    return NVML_SUCCESS;
  }
  if (*count < 1)
    return NVML_ERROR_INSUFFICIENT_SIZE;
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  unsigned long long now = (unsigned long long)ts.tv_sec * 1000000ULL + (unsigned long long)ts.tv_nsec / 1000ULL;
  if (now <= lastSeen) {
    *count = 0;
    return NVML_SUCCESS;
  }
  samples[0].timeStamp = now;
  samples[0].sampleValue.uiVal = STUB_UTIL[device.handle->index];
  *count = 1;
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization) {
  if (!valid(device) || utilization == NULL)
    return NVML_ERROR_INVALID_ARGUMENT;
  utilization->gpu = STUB_UTIL[device.handle->index];
  utilization->memory = 10;
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
  if (!valid(device) || memory == NULL)
    return NVML_ERROR_INVALID_ARGUMENT;
  memory->total = 80ULL << 30;
  memory->used = 20ULL << 30;
  memory->free = memory->total - memory->used;
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *current, unsigned int *pending) {
  (void)device;
  (void)current;
  (void)pending;
  return NVML_ERROR_NOT_SUPPORTED;
}

nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count) {
  (void)device;
  (void)count;
  return NVML_ERROR_NOT_SUPPORTED;
}

nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index, nvmlDevice_t *mig) {
  (void)device;
  (void)index;
  (void)mig;
  return NVML_ERROR_NOT_SUPPORTED;
}

/* GPU i is /dev/nvidia<i>. */
nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minorNumber) {
  if (!valid(device) || minorNumber == NULL)
    return NVML_ERROR_INVALID_ARGUMENT;
  *minorNumber = (unsigned int)device.handle->index;
  return NVML_SUCCESS;
}
