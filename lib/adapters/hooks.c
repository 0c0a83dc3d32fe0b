/* hooks.c: the allocator entry points of PyTorch (CUDAPluggableAllocator) and
 * CuPy (CFunctionAllocator), served by gmr_default_runtime(device).
 *
 * Each device's runtime is looked up once and kept in `hooks_rt`, so the hot
 * path is one atomic load and one gmr_alloc/gmr_free.  No CUDA header: streams
 * are void *.  A failed torch allocation raises torch.OutOfMemoryError: see
 * Note [Torch out-of-memory].
 */
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "core/internal.h"
#include "gmr_hooks.h"

#define HOOKS_MAX_DEVICES 64

/* hooks_rt[d]: gmr_default_runtime(d) once it has been created; written once
 * (NULL -> runtime) by whichever thread creates it, read by all. */
static _Atomic(gmr_runtime_t *) hooks_rt[HOOKS_MAX_DEVICES];

static gmr_runtime_t *hooks_runtime(int device) {
  if (device < 0 || device >= HOOKS_MAX_DEVICES) {
    gmr__error_set(GMR_EINVAL, "gmr hooks: device %d is out of range [0, %d)", device,
                   HOOKS_MAX_DEVICES);
    return NULL;
  }
  gmr_runtime_t *rt = atomic_load_explicit(&hooks_rt[device], memory_order_acquire);
  if (GMR_LIKELY(rt != NULL)) return rt;
  if (gmr_default_runtime(device, &rt) != 0) return NULL;
  atomic_store_explicit(&hooks_rt[device], rt, memory_order_release);
  return rt;
}

const char *gmr_hooks_last_error(void) {
  return gmr__error_last();
}

/* ---- raising torch's OutOfMemoryError ------------------------------------- */

/* Note [Torch out-of-memory]
 * PyTorch stores whatever alloc_fn returns without a check, so returning NULL
 * would hand a tensor address 0.  The C++ way out is an exception; PyTorch
 * translates c10::OutOfMemoryError into torch.OutOfMemoryError.
 * hooks_torch_throw() builds that exception through the Itanium C++ ABI with
 * symbols libc10 exports:
 *     obj = __cxa_allocate_exception(HOOKS_EXC_BYTES)
 *     c10::Error::Error(obj, SourceLocation{func, file, line}, std::string msg)
 *     *(void **)obj = vtable(c10::OutOfMemoryError) + 2 words
 *     __cxa_throw(obj, typeinfo(c10::OutOfMemoryError), vtable slot 2 (~OutOfMemoryError))
 * c10::OutOfMemoryError adds no member to c10::Error (`using Error::Error`),
 * so Error's constructor and destructor are the right ones once the vtable
 * pointer is OutOfMemoryError's.  The std::string argument is laid out as
 * libstdc++'s (C++11 ABI) {char *p; size_t len; union {char buf[16]; size_t
 * cap;}}, its heap buffer from libstdc++'s operator new.  Any symbol missing:
 * c10::detail::torchCheckFail (RuntimeError with the same text); no libc10 in
 * the process (tests, other callers): NULL.  The throw happens after every
 * gmr lock is released; this file is compiled with -fexceptions so the
 * unwinder can cross its frames.
 */

/* Room for a c10::Error (about 150 bytes in PyTorch 2.x); the exception
 * object's real size matters only to __cxa_allocate_exception. */
#define HOOKS_EXC_BYTES 1024

typedef struct hooks_srcloc_s { /* c10::SourceLocation */
  const char *function;
  const char *file;
  uint32_t line;
} hooks_srcloc_t;

typedef struct hooks_cxxstring_s { /* libstdc++ std::__cxx11::basic_string<char> */
  char *p;
  size_t len;
  union {
    char buf[16];
    size_t cap;
  } u;
} hooks_cxxstring_t;

typedef struct hooks_torch_abi_s {
  bool full; /* everything for c10::OutOfMemoryError was found */
  void *(*allocate_exception)(size_t);
  void (*free_exception)(void *);
  void (*cxa_throw)(void *, void *, void (*)(void *));
  void (*error_ctor)(void *self, hooks_srcloc_t loc, hooks_cxxstring_t *msg);
  void (*error_dtor)(void *self);
  void **oom_vtable;
  void *oom_typeinfo;
  void *(*op_new)(size_t);
  void (*op_delete)(void *);
  /* the fallback: throws c10::Error */
  void (*check_fail)(const char *func, const char *file, uint32_t line, const char *msg);
} hooks_torch_abi_t;

static hooks_torch_abi_t hooks_abi;
static pthread_once_t hooks_abi_once = PTHREAD_ONCE_INIT;

/* Each symbol is searched in every loaded libc10* and libtorch* (and their
 * dependencies: dlsym on a handle walks them), since the vtable and typeinfo
 * of c10::OutOfMemoryError are emitted only where it is used. */
#define HOOKS_MAX_LIBS 16
typedef struct hooks_libs_s {
  void *h[HOOKS_MAX_LIBS];
  int n;
} hooks_libs_t;

static int hooks_collect(struct dl_phdr_info *info, size_t size, void *ud) {
  (void)size;
  hooks_libs_t *libs = ud;
  const char *base = strrchr(info->dlpi_name, '/');
  base = base ? base + 1 : info->dlpi_name;
  if (strncmp(base, "libc10", 6) != 0 && strncmp(base, "libtorch", 8) != 0) return 0;
  if (libs->n == HOOKS_MAX_LIBS) return 1;
  /* Only what is already loaded: gmr never pulls torch in. */
  void *h = dlopen(info->dlpi_name, RTLD_NOW | RTLD_NOLOAD);
  if (h != NULL) libs->h[libs->n++] = h;
  return 0;
}

static void *hooks_sym(const hooks_libs_t *libs, const char *name) {
  for (int i = 0; i < libs->n; ++i) {
    void *p = dlsym(libs->h[i], name);
    if (p != NULL) return p;
  }
  return NULL;
}

static void hooks_abi_load(void) {
  hooks_libs_t libs;
  memset(&libs, 0, sizeof libs);
  dl_iterate_phdr(hooks_collect, &libs);
  if (libs.n == 0) return;
  hooks_torch_abi_t a;
  memset(&a, 0, sizeof a);
  const hooks_libs_t *h = &libs;
  *(void **)&a.allocate_exception = hooks_sym(h, "__cxa_allocate_exception");
  *(void **)&a.free_exception = hooks_sym(h, "__cxa_free_exception");
  *(void **)&a.cxa_throw = hooks_sym(h, "__cxa_throw");
  /* Base-object (C2/D2) and complete-object (C1/D1) variants are the same
   * code for a class without virtual bases; a library may export either. */
  *(void **)&a.error_ctor = hooks_sym(
      h,
      "_ZN3c105ErrorC2ENS_14SourceLocationENSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE");
  if (a.error_ctor == NULL)
    *(void **)&a.error_ctor = hooks_sym(
        h,
        "_ZN3c105ErrorC1ENS_14SourceLocationENSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE");
  a.oom_vtable = hooks_sym(h, "_ZTVN3c1016OutOfMemoryErrorE");
  /* The destructor: PyTorch builds with -fvisibility-inlines-hidden, so the
   * implicit ~Error() is not exported; the vtable holds it.  Its slots are
   * {offset to top, typeinfo, complete-object dtor, deleting dtor, what...}:
   * the vptr points at slot 2, the complete-object destructor. */
  if (a.oom_vtable != NULL) *(void **)&a.error_dtor = a.oom_vtable[2];
  a.oom_typeinfo = hooks_sym(h, "_ZTIN3c1016OutOfMemoryErrorE");
  /* operator new/delete as torch's own code binds them: the global scope
   * first (where a sanitizer's replacements live), else torch's libstdc++. */
  *(void **)&a.op_new = dlsym(RTLD_DEFAULT, "_Znwm");
  *(void **)&a.op_delete = dlsym(RTLD_DEFAULT, "_ZdlPv");
  if (a.op_new == NULL || a.op_delete == NULL) {
    *(void **)&a.op_new = hooks_sym(h, "_Znwm");
    *(void **)&a.op_delete = hooks_sym(h, "_ZdlPv");
  }
  *(void **)&a.check_fail = hooks_sym(h, "_ZN3c106detail14torchCheckFailEPKcS2_jS2_");
  a.full = a.allocate_exception && a.free_exception && a.cxa_throw && a.error_ctor &&
           a.error_dtor && a.oom_vtable && a.oom_typeinfo && a.op_new && a.op_delete;
  if (!a.full)
    gmr__log(GMR_LOG_WARN,
             "gmr hooks: torch's OutOfMemoryError cannot be raised (missing:%s%s%s%s%s%s); "
             "an allocation failure raises RuntimeError",
             a.cxa_throw ? "" : " __cxa_throw", a.error_ctor ? "" : " c10::Error::Error",
             a.error_dtor ? "" : " c10::Error::~Error", a.oom_vtable ? "" : " vtable",
             a.oom_typeinfo ? "" : " typeinfo", a.op_new ? "" : " operator new");
  hooks_abi = a; /* the handles stay open: libc10 outlives every hook call */
}

/* Raise torch's OutOfMemoryError with `msg`; returns only when torch's
 * library is not in the process.  See Note [Torch out-of-memory]. */
static void hooks_torch_throw(const char *msg) {
  pthread_once(&hooks_abi_once, hooks_abi_load);
  const hooks_torch_abi_t *a = &hooks_abi;
  hooks_srcloc_t loc = {"gmr_torch_alloc", "lib/adapters/hooks.c", (uint32_t)__LINE__};
  if (a->full) {
    size_t n = strlen(msg);
    hooks_cxxstring_t s;
    memset(&s, 0, sizeof s);
    if (n < sizeof s.u.buf) {
      s.p = s.u.buf;
    } else {
      s.p = a->op_new(n + 1); /* throws std::bad_alloc itself on failure */
      s.u.cap = n;
    }
    memcpy(s.p, msg, n + 1);
    s.len = n;
    void *exc = a->allocate_exception(HOOKS_EXC_BYTES);
    memset(exc, 0, HOOKS_EXC_BYTES);
    a->error_ctor(exc, loc, &s);
    /* The argument was moved from or copied; a temporary's owner frees it. */
    if (s.p != s.u.buf) a->op_delete(s.p);
    *(void **)exc = (void *)(a->oom_vtable + 2);
    a->cxa_throw(exc, a->oom_typeinfo, a->error_dtor);
  }
  if (a->check_fail != NULL) a->check_fail(loc.function, loc.file, loc.line, msg);
}

/* ---- PyTorch ------------------------------------------------------------------ */

void *gmr_torch_alloc(ssize_t size, int device, void *stream) {
  if (size <= 0) return NULL; /* 0-byte tensors: no allocation, as PyTorch's own */
  gmr_runtime_t *rt = hooks_runtime(device);
  void *p = NULL;
  if (GMR_LIKELY(rt != NULL) && GMR_LIKELY(gmr_alloc(rt, (size_t)size, stream, &p) == 0)) return p;
  /* The text is the thread's last error: the policy's OOM report, or why no
   * runtime could be made; the exception gets its own copy. */
  const char *why = gmr__error_last();
  gmr__log(GMR_LOG_WARN, "gmr_torch_alloc(%zd bytes, device %d): %s", size, device, why);
  hooks_torch_throw(why[0] ? why : "gmr: allocation failed");
  return NULL;
}

void gmr_torch_free(void *ptr, ssize_t size, int device, void *stream) {
  if (ptr == NULL) return;
  gmr_runtime_t *rt = hooks_runtime(device);
  int err = rt ? gmr_free(rt, ptr) : GMR_EINVAL;
  if (err != 0)
    gmr__log(GMR_LOG_ERROR, "gmr_torch_free(%p, %zd bytes, device %d): %s", ptr, size, device,
             gmr__error_last());
}

void gmr_torch_empty_cache(void) {
  for (int d = 0; d < HOOKS_MAX_DEVICES; ++d) {
    gmr_runtime_t *rt = atomic_load_explicit(&hooks_rt[d], memory_order_acquire);
    if (rt != NULL) gmr_empty_cache(rt);
  }
}

void gmr_torch_record_stream(void *ptr, void *stream) {
  for (int d = 0; d < HOOKS_MAX_DEVICES; ++d) {
    gmr_runtime_t *rt = atomic_load_explicit(&hooks_rt[d], memory_order_acquire);
    if (rt != NULL && gmr_record_stream(rt, ptr, stream) == 0) return;
  }
  gmr__log(GMR_LOG_ERROR, "gmr_torch_record_stream(%p): no gmr runtime owns this pointer", ptr);
}

/* ---- CuPy --------------------------------------------------------------------- */

void *gmr_cupy_malloc(void *param, size_t size, int device_id) {
  (void)param;
  if (size == 0) return NULL;
  gmr_runtime_t *rt = hooks_runtime(device_id);
  void *p = NULL;
  if (rt == NULL || gmr_alloc(rt, size, NULL, &p) != 0) return NULL;
  return p;
}

void gmr_cupy_free(void *param, void *ptr, int device_id) {
  (void)param;
  if (ptr == NULL) return;
  gmr_runtime_t *rt = hooks_runtime(device_id);
  int err = rt ? gmr_free(rt, ptr) : GMR_EINVAL;
  if (err != 0)
    gmr__log(GMR_LOG_ERROR, "gmr_cupy_free(%p, device %d): %s", ptr, device_id, gmr__error_last());
}
