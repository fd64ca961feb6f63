/*
 * runtime.c — load an artifact's CPU code and run its plan (kiln.h §§ 2-3).
 *
 * Loading: the ELF shared object is sanity-checked (class, machine, every
 * segment inside the blob, so a truncated blob cannot fault the loader),
 * written to a memfd and dlopen'ed as /proc/self/fd/N; the fd is closed
 * right after. glibc recognises an already-loaded library by its path
 * string, and fd numbers are reused, so before dlopen the path is probed
 * with RTLD_NOLOAD and the memfd moved to another number while that path
 * names a library still loaded (another live module).
 *
 * Running: every run takes a context (symbol values, evaluated sizes, buffer
 * pointers, resolved views and the 64-byte aligned scratch arena) from the
 * module's free list, or makes one, and gives it back afterwards; so a
 * module runs from any number of threads at once and a steady stream of
 * runs allocates nothing. A run checks everything that depends on the
 * inputs (bindings, symbol bounds, input specs, arena layout, view bounds)
 * before the first step runs.
 *
 * Invariants: a module and its artifact are immutable after load; the free
 * list and nothing else is guarded by m->mu; counters are relaxed atomics;
 * kiln's dlopen and dlclose calls take dl_mu.
 */
#include "clients/libkiln/kiln.h"

#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

static double prof_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

#if defined(__x86_64__)
#define HOST_EM	     EM_X86_64
#define HOST_EM_NAME "x86-64"
#elif defined(__aarch64__)
#define HOST_EM	     EM_AARCH64
#define HOST_EM_NAME "aarch64"
#else
#error "libkiln's CPU runtime supports x86-64 and aarch64 hosts"
#endif

#define MAX_FREE_CONTEXTS 16
#define MAX_DLOPEN_PROBES 4096

typedef struct exec {
	struct exec *next;    /* free list */
	int64_t *syms;	      /* n_symbols */
	int64_t *extents;     /* n_kernels */
	int64_t *bytes;	      /* n_buffers: evaluated (input: its span) */
	int64_t *offs;	      /* n_buffers: arena offset (ARENA only) */
	int64_t *spans;	      /* n_inputs: bytes each input tensor spans */
	uint8_t **bufp;	      /* n_buffers */
	void **argv;	      /* max kernel n_bufs */
	kiln_tensor_t *views; /* n_views */
	uint8_t *allocated;   /* n_out_buffers: the runtime allocated it */
	uint8_t *arena;
	size_t arena_cap;
} exec_t;

struct kiln_module {
	kiln_artifact_t *a; /* owned */
	void *dl;	    /* dlopen handle; NULL without kernels */
	kiln_kernel_fn *fns;
	uint32_t *out_buf;  /* output buffer k -> buffer index */
	uint32_t max_kbufs; /* most buffers any kernel takes */
	bool has_fallback;
	size_t exec_bytes; /* one exec_t with its arrays */
	pthread_mutex_t mu;
	exec_t *free_list;
	unsigned n_free;
	_Atomic uint64_t runs, failed_runs, contexts, arena_allocs, fallbacks;
};

_Static_assert(sizeof(kiln_kernel_fn) == sizeof(void *),
	       "dlsym results must fit a function pointer");

static void count(_Atomic uint64_t *c)
{
	atomic_fetch_add_explicit(c, 1, memory_order_relaxed);
}

/* ---- loading ------------------------------------------------------------ */

/* Overflow-safe "off + len <= total". */
static bool fits(uint64_t off, uint64_t len, uint64_t total)
{
	return off <= total && len <= total - off;
}

static int check_elf(const uint8_t *p, size_t n, char *err, size_t errlen)
{
	Elf64_Ehdr eh;
	if (n < sizeof(eh))
		return kiln__errf(err, errlen, KILN_EINVGRAPH,
				  "code object: %zu bytes is too short for an "
				  "ELF header",
				  n);
	memcpy(&eh, p, sizeof(eh));
	if (memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0)
		return kiln__errf(err, errlen, KILN_EINVGRAPH,
				  "code object: not an ELF file (bad magic)");
	if (eh.e_ident[EI_CLASS] != ELFCLASS64 ||
	    eh.e_ident[EI_DATA] != ELFDATA2LSB)
		return kiln__errf(err, errlen, KILN_EINVGRAPH,
				  "code object: not a 64-bit little-endian "
				  "ELF file");
	if (eh.e_type != ET_DYN)
		return kiln__errf(err, errlen, KILN_EINVGRAPH,
				  "code object: ELF type %u is not a shared "
				  "object",
				  (unsigned)eh.e_type);
	if (eh.e_machine != HOST_EM)
		return kiln__errf(err, errlen, KILN_EINVGRAPH,
				  "code object: ELF machine %u, but this host "
				  "is " HOST_EM_NAME,
				  (unsigned)eh.e_machine);
	if (eh.e_phentsize != sizeof(Elf64_Phdr) ||
	    !fits(eh.e_phoff, (uint64_t)eh.e_phnum * sizeof(Elf64_Phdr), n))
		return kiln__errf(err, errlen, KILN_EINVGRAPH,
				  "code object: program headers lie outside "
				  "the %zu bytes",
				  n);
	for (unsigned i = 0; i < eh.e_phnum; i++) {
		Elf64_Phdr ph;
		memcpy(&ph, p + eh.e_phoff + i * sizeof(ph), sizeof(ph));
		if (ph.p_filesz > 0 && !fits(ph.p_offset, ph.p_filesz, n))
			return kiln__errf(err, errlen, KILN_EINVGRAPH,
					  "code object: segment %u "
					  "[%llu, +%llu) lies outside the %zu "
					  "bytes (truncated?)",
					  i, (unsigned long long)ph.p_offset,
					  (unsigned long long)ph.p_filesz, n);
	}
	return 0;
}

static int write_all(int fd, const uint8_t *p, size_t n)
{
	while (n > 0) {
		ssize_t w = write(fd, p, n);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		p += w;
		n -= (size_t)w;
	}
	return 0;
}

/* The smallest buffer a kernel writes with streaming stores (compiler/
 * codegen.c nt_setup; the code object's kiln_nt_min): KILN_NT_BYTES (a
 * byte count, with an optional K, M or G suffix of 1024s, or "off"), else
 * 3/4 of the L3 cache the first CPU shares (sysfs; sysconf where sysfs
 * has none), glibc's threshold for its own non-temporal memcpy. No L3
 * known: off. */
static pthread_once_t nt_once = PTHREAD_ONCE_INIT;
static int64_t nt_min = INT64_MAX;
static char nt_bad[160];

/* A size: digits and an optional K/M/G suffix; -1 if s is not one. */
static int64_t parse_bytes(const char *s)
{
	char *end = NULL;
	errno = 0;
	long long v = strtoll(s, &end, 10);
	if (end == s || errno != 0 || v < 0 || *s == '-' || *s == '+')
		return -1;
	int sh = 0;
	if (*end == 'K' || *end == 'k')
		sh = 10;
	else if (*end == 'M' || *end == 'm')
		sh = 20;
	else if (*end == 'G' || *end == 'g')
		sh = 30;
	if (sh != 0)
		end++;
	if (*end != '\0' || v > (INT64_MAX >> sh))
		return -1;
	return (int64_t)v << sh;
}

static int64_t l3_bytes(void)
{
	for (int i = 0; i < 16; i++) {
		char path[96], buf[64];
		snprintf(path, sizeof(path),
			 "/sys/devices/system/cpu/cpu0/cache/index%d/level", i);
		FILE *f = fopen(path, "r");
		if (f == NULL)
			break;
		bool l3 = fgets(buf, sizeof(buf), f) != NULL && atoi(buf) == 3;
		fclose(f);
		if (!l3)
			continue;
		snprintf(path, sizeof(path),
			 "/sys/devices/system/cpu/cpu0/cache/index%d/size", i);
		f = fopen(path, "r");
		if (f == NULL)
			break;
		int64_t n = -1;
		if (fgets(buf, sizeof(buf), f) != NULL) {
			buf[strcspn(buf, "\n")] = '\0';
			n = parse_bytes(buf);
		}
		fclose(f);
		if (n > 0)
			return n;
	}
	long v = sysconf(_SC_LEVEL3_CACHE_SIZE);
	return v > 0 ? (int64_t)v : 0;
}

static void nt_init(void)
{
	const char *env = getenv("KILN_NT_BYTES");
	if (env != NULL && *env != '\0') {
		int64_t v =
		    strcmp(env, "off") == 0 ? INT64_MAX : parse_bytes(env);
		if (v < 0)
			snprintf(nt_bad, sizeof(nt_bad),
				 "KILN_NT_BYTES=\"%.64s\": expected a byte "
				 "count (K, M or G suffix allowed) or off",
				 env);
		else
			nt_min = v;
		return;
	}
	int64_t l3 = l3_bytes();
	nt_min = l3 > 0 ? l3 / 4 * 3 : INT64_MAX;
}

int64_t kiln_nt_min_bytes(void)
{
	pthread_once(&nt_once, nt_init);
	return nt_bad[0] != '\0' ? -1 : nt_min;
}

/* kiln's dlopen and dlclose calls, one at a time. glibc's loader orders
 * them anyway (its own dl_load_lock), but ThreadSanitizer does not see that
 * lock: when one thread's NOLOAD probe took a reference to another thread's
 * module and dropped it after that module was freed, the dlclose freed
 * what the other thread's dlopen had allocated, and ThreadSanitizer
 * reported a data race (concurrent_compile under build-tsan, once in CI; a
 * two-thread loop of dlopen and NOLOAD probes of one library reproduces it
 * every time, and this lock silences it). Loads are rare and the loader
 * serializes them already, so the lock costs nothing. */
static pthread_mutex_t dl_mu = PTHREAD_MUTEX_INITIALIZER;

/* memfd + dlopen + dlsym of every kernel into m->dl / m->fns. */
static int load_code(kiln_module_t *m, char *err, size_t errlen)
{
	const kiln_artifact_t *a = m->a;
	int rc = check_elf(a->code, a->code_len, err, errlen);
	if (rc != 0)
		return rc;
	int64_t ntb = kiln_nt_min_bytes();
	if (ntb < 0)
		return kiln__errf(err, errlen, -EINVAL, "%s", nt_bad);
	int fd = memfd_create("kiln-module", MFD_CLOEXEC);
	if (fd < 0)
		return kiln__errf(err, errlen, -errno, "memfd_create: %s",
				  strerror(errno));
	rc = write_all(fd, a->code, a->code_len);
	if (rc != 0) {
		close(fd);
		return kiln__errf(err, errlen, rc,
				  "writing the code object to a memfd: %s",
				  strerror(-rc));
	}
	char path[64];
	pthread_mutex_lock(&dl_mu);
	for (int probe = 0;; probe++) {
		snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
		void *old = dlopen(path, RTLD_LAZY | RTLD_NOLOAD);
		if (old == NULL)
			break;
		dlclose(old); /* drop the reference NOLOAD took */
		int fd2 = probe < MAX_DLOPEN_PROBES
			      ? fcntl(fd, F_DUPFD_CLOEXEC, fd + 1)
			      : -1;
		if (fd2 < 0) {
			pthread_mutex_unlock(&dl_mu);
			close(fd);
			return kiln__errf(err, errlen, -EMFILE,
					  "no free /proc/self/fd path to "
					  "dlopen the code object from");
		}
		close(fd);
		fd = fd2;
	}
	m->dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	const char *why = m->dl == NULL ? dlerror() : NULL;
	pthread_mutex_unlock(&dl_mu);
	close(fd);
	if (m->dl == NULL) {
		return kiln__errf(err, errlen, KILN_EINVGRAPH,
				  "code object: dlopen failed: %s",
				  why != NULL ? why : "unknown error");
	}
	for (uint32_t k = 0; k < a->n_kernels; k++) {
		dlerror();
		void *sym = dlsym(m->dl, a->kernels[k].name);
		if (sym == NULL)
			return kiln__errf(err, errlen, KILN_EINVGRAPH,
					  "kernel %u: symbol \"%s\" not found "
					  "in the code object",
					  k, a->kernels[k].name);
		memcpy(&m->fns[k], &sym, sizeof(sym));
	}
	/* absent from code that writes nothing that large */
	int64_t *ntp = dlsym(m->dl, "kiln_nt_min");
	if (ntp != NULL)
		*ntp = ntb;
	return 0;
}

static size_t align8(size_t n)
{
	return (n + 7) & ~(size_t)7;
}

int kiln_module_from_artifact(kiln_artifact_t *a, kiln_module_t **out,
			      char *err, size_t errlen)
{
	*out = NULL;
	if (a == NULL)
		return kiln__errf(err, errlen, -EINVAL, "no artifact");
	if (strcmp(a->target.backend, "cpu") != 0) {
		int rc =
		    kiln__errf(err, errlen, KILN_EUNSUPOP,
			       "a %s%s%s artifact cannot be loaded: this "
			       "runtime runs CPU code only (CUDA "
			       "support is a later issue)",
			       a->target.backend, a->target.arch[0] ? " " : "",
			       a->target.arch);
		kiln_artifact_free(a);
		return rc;
	}
	kiln_module_t *m = calloc(1, sizeof(*m));
	if (m == NULL) {
		kiln_artifact_free(a);
		return kiln__errf(err, errlen, -ENOMEM, "out of memory");
	}
	m->a = a;
	if (pthread_mutex_init(&m->mu, NULL) != 0) {
		kiln_artifact_free(a);
		free(m);
		return kiln__errf(err, errlen, -ENOMEM, "pthread_mutex_init");
	}
	m->fns = calloc(a->n_kernels ? a->n_kernels : 1, sizeof(*m->fns));
	m->out_buf =
	    calloc(a->n_out_buffers ? a->n_out_buffers : 1, sizeof(uint32_t));
	if (m->fns == NULL || m->out_buf == NULL) {
		kiln_module_free(m);
		return kiln__errf(err, errlen, -ENOMEM, "out of memory");
	}
	for (uint32_t k = 0; k < a->n_kernels; k++)
		if (a->kernels[k].n_bufs > m->max_kbufs)
			m->max_kbufs = a->kernels[k].n_bufs;
	for (uint32_t b = 0; b < a->n_buffers; b++)
		if (a->buffers[b].kind == KILN_BUF_OUTPUT)
			m->out_buf[a->buffers[b].index] = b;
	for (uint32_t s = 0; s < a->n_steps; s++)
		if (a->steps[s].kind == KILN_STEP_FALLBACK)
			m->has_fallback = true;
	m->exec_bytes =
	    align8(sizeof(exec_t)) +
	    8 * ((size_t)a->n_symbols + a->n_kernels +
		 3 * (size_t)a->n_buffers + a->n_inputs + m->max_kbufs) +
	    sizeof(kiln_tensor_t) * a->n_views + align8(a->n_out_buffers);
	if (a->n_kernels > 0) {
		/* before any kernel can load OpenBLAS (blas.c) */
		kiln_blas_prepare();
		int rc = load_code(m, err, errlen);
		if (rc != 0) {
			kiln_module_free(m);
			return rc;
		}
	}
	*out = m;
	return 0;
}

int kiln_module_load(const uint8_t *p, size_t n, const kiln_limits_t *lim,
		     kiln_module_t **out, char *err, size_t errlen)
{
	kiln_artifact_t *a;
	*out = NULL;
	int rc = kiln_artifact_decode(p, n, lim, &a, err, errlen);
	if (rc != 0)
		return rc;
	return kiln_module_from_artifact(a, out, err, errlen);
}

static void exec_free(exec_t *x)
{
	if (x != NULL) {
		free(x->arena);
		free(x);
	}
}

void kiln_module_free(kiln_module_t *m)
{
	if (m == NULL)
		return;
	if (m->dl != NULL) {
		pthread_mutex_lock(&dl_mu);
		dlclose(m->dl);
		pthread_mutex_unlock(&dl_mu);
	}
	exec_t *x = m->free_list;
	while (x != NULL) {
		exec_t *next = x->next;
		exec_free(x);
		x = next;
	}
	pthread_mutex_destroy(&m->mu);
	free(m->fns);
	free(m->out_buf);
	kiln_artifact_free(m->a);
	free(m);
}

const kiln_artifact_t *kiln_module_artifact(const kiln_module_t *m)
{
	return m->a;
}

kiln_kernel_fn kiln_module_kernel(const kiln_module_t *m, uint32_t k)
{
	return k < m->a->n_kernels ? m->fns[k] : NULL;
}

uint32_t kiln_module_n_inputs(const kiln_module_t *m)
{
	return m->a->n_inputs;
}

uint32_t kiln_module_n_outputs(const kiln_module_t *m)
{
	return m->a->n_outputs;
}

uint32_t kiln_module_n_out_buffers(const kiln_module_t *m)
{
	return m->a->n_out_buffers;
}

uint32_t kiln_module_n_steps(const kiln_module_t *m)
{
	return m->a->n_steps;
}

void kiln_module_stats(const kiln_module_t *m, kiln_module_stats_t *out)
{
	kiln_module_t *mm = (kiln_module_t *)m;
	out->runs = atomic_load_explicit(&mm->runs, memory_order_relaxed);
	out->failed_runs =
	    atomic_load_explicit(&mm->failed_runs, memory_order_relaxed);
	out->contexts =
	    atomic_load_explicit(&mm->contexts, memory_order_relaxed);
	out->arena_allocs =
	    atomic_load_explicit(&mm->arena_allocs, memory_order_relaxed);
	out->fallbacks =
	    atomic_load_explicit(&mm->fallbacks, memory_order_relaxed);
}

/* ---- run contexts ------------------------------------------------------- */

static exec_t *exec_get(kiln_module_t *m)
{
	pthread_mutex_lock(&m->mu);
	exec_t *x = m->free_list;
	if (x != NULL) {
		m->free_list = x->next;
		m->n_free--;
	}
	pthread_mutex_unlock(&m->mu);
	if (x != NULL)
		return x;
	const kiln_artifact_t *a = m->a;
	x = calloc(1, m->exec_bytes);
	if (x == NULL)
		return NULL;
	count(&m->contexts);
	uint8_t *p = (uint8_t *)x + align8(sizeof(exec_t));
	x->syms = (int64_t *)p;
	p += 8 * (size_t)a->n_symbols;
	x->extents = (int64_t *)p;
	p += 8 * (size_t)a->n_kernels;
	x->bytes = (int64_t *)p;
	p += 8 * (size_t)a->n_buffers;
	x->offs = (int64_t *)p;
	p += 8 * (size_t)a->n_buffers;
	x->spans = (int64_t *)p;
	p += 8 * (size_t)a->n_inputs;
	x->bufp = (uint8_t **)p;
	p += 8 * (size_t)a->n_buffers;
	x->argv = (void **)p;
	p += 8 * (size_t)m->max_kbufs;
	x->views = (kiln_tensor_t *)p;
	p += sizeof(kiln_tensor_t) * a->n_views;
	x->allocated = p;
	return x;
}

static void exec_put(kiln_module_t *m, exec_t *x)
{
	pthread_mutex_lock(&m->mu);
	if (m->n_free < MAX_FREE_CONTEXTS) {
		x->next = m->free_list;
		m->free_list = x;
		m->n_free++;
		x = NULL;
	}
	pthread_mutex_unlock(&m->mu);
	exec_free(x);
}

/* ---- checking the inputs ------------------------------------------------ */

static int ev(kiln_dim_t d, const int64_t *syms, int64_t *out)
{
	if (d.e == NULL) {
		*out = d.c;
		return 0;
	}
	return kiln_expr_eval(d.e, syms, out);
}

/* "[1, 4]" into buf. */
static const char *fmt_list(char *buf, size_t n, const int64_t *v, uint32_t k)
{
	size_t len = 0;
	int w = snprintf(buf, n, "[");
	len = w > 0 ? (size_t)w : 0;
	for (uint32_t i = 0; i < k && len < n; i++) {
		w = snprintf(buf + len, n - len, "%s%lld", i ? ", " : "",
			     (long long)v[i]);
		len += w > 0 ? (size_t)w : 0;
	}
	if (len < n)
		snprintf(buf + len, n - len, "]");
	return buf;
}

/* The bytes a tensor's elements span from its data pointer (0 if empty);
 * -1 on overflow. */
static int64_t span_bytes(const int64_t *sizes, const int64_t *strides,
			  uint32_t rank, int64_t offset, size_t elsize)
{
	int64_t last = offset;
	for (uint32_t i = 0; i < rank; i++)
		if (sizes[i] == 0)
			return 0;
	for (uint32_t i = 0; i < rank; i++) {
		int64_t t;
		if (__builtin_mul_overflow(sizes[i] - 1, strides[i], &t) ||
		    __builtin_add_overflow(last, t, &last))
			return -1;
	}
	int64_t r;
	if (__builtin_add_overflow(last, 1, &last) ||
	    __builtin_mul_overflow(last, (int64_t)elsize, &r))
		return -1;
	return r;
}

static const char *io_kind_name(kiln_io_kind_t k)
{
	return k == KILN_IO_INT ? "an int" : "a tensor";
}

/* Kinds, dtypes and ranks: what binding symbols relies on. */
static int check_shapes(const kiln_artifact_t *a, const kiln_io_t *in,
			char *err, size_t errlen)
{
	for (uint32_t i = 0; i < a->n_inputs; i++) {
		const kiln_value_t *v = &a->inputs[i];
		kiln_io_kind_t want =
		    v->kind == KILN_VAL_SYMINT ? KILN_IO_INT : KILN_IO_TENSOR;
		if (in[i].kind != want)
			return kiln__errf(err, errlen, KILN_EINVGRAPH,
					  "input %u: %s but the artifact "
					  "takes %s",
					  i, io_kind_name(in[i].kind),
					  io_kind_name(want));
		if (want == KILN_IO_INT)
			continue;
		const kiln_tensor_t *t = &in[i].t;
		if (t->dtype != v->dtype)
			return kiln__errf(
			    err, errlen, KILN_EINVGRAPH,
			    "input %u: dtype %s but the artifact was compiled "
			    "for %s",
			    i,
			    kiln_dtype_name(t->dtype)
				? kiln_dtype_name(t->dtype)
				: "(invalid)",
			    kiln_dtype_name(v->dtype));
		if (t->rank != v->rank)
			return kiln__errf(err, errlen, KILN_EINVGRAPH,
					  "input %u: rank %u but the artifact "
					  "was compiled for rank %u",
					  i, t->rank, v->rank);
	}
	return 0;
}

static int bind_symbols(const kiln_artifact_t *a, const kiln_io_t *in,
			int64_t *syms, char *err, size_t errlen)
{
	for (uint32_t s = 0; s < a->n_symbols; s++) {
		const kiln_art_binding_t *b = &a->bindings[s];
		const kiln_symbol_t *sy = &a->symbols[s];
		int64_t v =
		    b->dim < 0 ? in[b->input].i : in[b->input].t.sizes[b->dim];
		char place[48];
		if (b->dim < 0)
			snprintf(place, sizeof(place), "input %u", b->input);
		else
			snprintf(place, sizeof(place), "input %u size %d",
				 b->input, b->dim);
		if (v < sy->min)
			return kiln__errf(err, errlen, KILN_EINVGRAPH,
					  "symbol %s = %lld (%s) is below its "
					  "minimum %lld",
					  sy->name, (long long)v, place,
					  (long long)sy->min);
		if (sy->max >= 0 && v > sy->max)
			return kiln__errf(err, errlen, KILN_EINVGRAPH,
					  "symbol %s = %lld (%s) is above its "
					  "maximum %lld",
					  sy->name, (long long)v, place,
					  (long long)sy->max);
		syms[s] = v;
	}
	return 0;
}

static int eval_fail(char *err, size_t errlen, const char *what, uint32_t i,
		     const char *part, uint32_t k)
{
	return kiln__errf(err, errlen, KILN_EINVGRAPH,
			  "%s %u: %s %u cannot be evaluated for these "
			  "inputs (overflow, division by zero or negative)",
			  what, i, part, k);
}

static int check_values(const kiln_artifact_t *a, const kiln_io_t *in,
			const int64_t *syms, int64_t *bytes_of_input, char *err,
			size_t errlen)
{
	int64_t want_sz[KILN_MAX_RANK_HARD], want_st[KILN_MAX_RANK_HARD];
	char b1[256], b2[256];
	for (uint32_t i = 0; i < a->n_inputs; i++) {
		const kiln_value_t *v = &a->inputs[i];
		if (v->kind == KILN_VAL_SYMINT) {
			int64_t want;
			if (kiln_expr_eval(v->sym, syms, &want) != 0)
				return eval_fail(err, errlen, "input", i,
						 "value", 0);
			if (in[i].i != want)
				return kiln__errf(err, errlen, KILN_EINVGRAPH,
						  "input %u: int %lld but the "
						  "artifact expects %lld",
						  i, (long long)in[i].i,
						  (long long)want);
			continue;
		}
		const kiln_tensor_t *t = &in[i].t;
		bool empty = false;
		for (uint32_t d = 0; d < v->rank; d++) {
			if (ev(v->sizes[d], syms, &want_sz[d]) != 0 ||
			    want_sz[d] < 0)
				return eval_fail(err, errlen, "input", i,
						 "size", d);
			if (ev(v->strides[d], syms, &want_st[d]) != 0 ||
			    want_st[d] < 0)
				return eval_fail(err, errlen, "input", i,
						 "stride", d);
			if (want_sz[d] == 0)
				empty = true;
		}
		for (uint32_t d = 0; d < v->rank; d++)
			if (t->sizes[d] != want_sz[d])
				return kiln__errf(
				    err, errlen, KILN_EINVGRAPH,
				    "input %u: sizes %s but the artifact was "
				    "compiled for %s",
				    i,
				    fmt_list(b1, sizeof(b1), t->sizes, t->rank),
				    fmt_list(b2, sizeof(b2), want_sz, v->rank));
		for (uint32_t d = 0; d < v->rank && !empty; d++)
			if (want_sz[d] > 1 && t->strides[d] != want_st[d])
				return kiln__errf(
				    err, errlen, KILN_EINVGRAPH,
				    "input %u: strides %s but the artifact was "
				    "compiled for %s",
				    i,
				    fmt_list(b1, sizeof(b1), t->strides,
					     t->rank),
				    fmt_list(b2, sizeof(b2), want_st, v->rank));
		int64_t span = span_bytes(t->sizes, t->strides, t->rank, 0,
					  kiln_dtype_size(t->dtype));
		if (span < 0)
			return kiln__errf(err, errlen, KILN_EINVGRAPH,
					  "input %u: its extent overflows", i);
		if (span > 0 && t->data == NULL)
			return kiln__errf(err, errlen, KILN_EINVGRAPH,
					  "input %u: data is NULL", i);
		bytes_of_input[i] = span;
	}
	return 0;
}

/* Everything that depends on the inputs but not on memory: symbols, input
 * checks, buffer sizes and the arena layout. Fills x->syms, x->bytes and
 * *arena_bytes. */
static int prepare(const kiln_module_t *m, exec_t *x, const kiln_io_t *in,
		   uint32_t n_in, int64_t *arena_bytes, char *err,
		   size_t errlen)
{
	const kiln_artifact_t *a = m->a;
	if (n_in != a->n_inputs || (n_in > 0 && in == NULL))
		return kiln__errf(err, errlen, KILN_EINVGRAPH,
				  "%u inputs given, the artifact takes %u",
				  in == NULL ? 0 : n_in, a->n_inputs);
	int rc = check_shapes(a, in, err, errlen);
	if (rc == 0)
		rc = bind_symbols(a, in, x->syms, err, errlen);
	if (rc != 0)
		return rc;
	rc = check_values(a, in, x->syms, x->spans, err, errlen);
	if (rc == 0 &&
	    (ev(a->arena_bytes, x->syms, arena_bytes) != 0 || *arena_bytes < 0))
		rc = kiln__errf(err, errlen, KILN_EINVGRAPH,
				"arena_bytes cannot be evaluated for these "
				"inputs");
	for (uint32_t b = 0; rc == 0 && b < a->n_buffers; b++) {
		const kiln_art_buffer_t *bf = &a->buffers[b];
		if (bf->kind == KILN_BUF_INPUT) {
			x->bytes[b] = x->spans[bf->index];
			continue;
		}
		if (ev(bf->bytes, x->syms, &x->bytes[b]) != 0 ||
		    x->bytes[b] < 0) {
			rc = eval_fail(err, errlen, "buffer", b, "bytes", 0);
			break;
		}
		if (bf->kind != KILN_BUF_ARENA)
			continue;
		int64_t off;
		if (ev(bf->offset, x->syms, &off) != 0 || off < 0) {
			rc = eval_fail(err, errlen, "buffer", b, "offset", 0);
			break;
		}
		if (off % 64 != 0 || off > *arena_bytes ||
		    x->bytes[b] > *arena_bytes - off)
			rc = kiln__errf(err, errlen, KILN_EINVGRAPH,
					"buffer %u: arena bytes [%lld, +%lld) "
					"are unaligned or exceed arena_bytes "
					"%lld",
					b, (long long)off,
					(long long)x->bytes[b],
					(long long)*arena_bytes);
		x->offs[b] = off;
	}
	return rc;
}

/* Resolves view v into x->views[v], checking it lies inside its buffer. */
static int resolve_view(const kiln_artifact_t *a, exec_t *x, uint32_t v,
			char *err, size_t errlen)
{
	const kiln_art_view_t *vw = &a->views[v];
	kiln_tensor_t *t = &x->views[v];
	t->dtype = vw->dtype;
	t->rank = vw->rank;
	for (uint32_t d = 0; d < vw->rank; d++) {
		if (ev(vw->sizes[d], x->syms, &t->sizes[d]) != 0 ||
		    t->sizes[d] < 0)
			return eval_fail(err, errlen, "view", v, "size", d);
		if (ev(vw->strides[d], x->syms, &t->strides[d]) != 0 ||
		    t->strides[d] < 0)
			return eval_fail(err, errlen, "view", v, "stride", d);
	}
	int64_t off;
	if (ev(vw->offset, x->syms, &off) != 0 || off < 0)
		return eval_fail(err, errlen, "view", v, "offset", 0);
	size_t el = kiln_dtype_size(vw->dtype);
	int64_t span = span_bytes(t->sizes, t->strides, t->rank, off, el);
	int64_t start;
	if (span < 0 || __builtin_mul_overflow(off, (int64_t)el, &start))
		return kiln__errf(err, errlen, KILN_EINVGRAPH,
				  "view %u: its extent overflows", v);
	if (span < start)
		span = start; /* empty: only the pointer must be in range */
	if (span > x->bytes[vw->buffer])
		return kiln__errf(err, errlen, KILN_EINVGRAPH,
				  "view %u: needs %lld bytes of buffer %u, "
				  "which has %lld",
				  v, (long long)span, vw->buffer,
				  (long long)x->bytes[vw->buffer]);
	uint8_t *base = x->bufp[vw->buffer];
	t->data = base != NULL ? base + start : NULL;
	return 0;
}

int kiln_module_out_sizes(kiln_module_t *m, const kiln_io_t *inputs,
			  uint32_t n_inputs, size_t *sizes, char *err,
			  size_t errlen)
{
	exec_t *x = exec_get(m);
	if (x == NULL)
		return kiln__errf(err, errlen, -ENOMEM, "out of memory");
	int64_t arena_bytes;
	int rc = prepare(m, x, inputs, n_inputs, &arena_bytes, err, errlen);
	if (rc == 0)
		for (uint32_t k = 0; k < m->a->n_out_buffers; k++)
			sizes[k] = (size_t)x->bytes[m->out_buf[k]];
	exec_put(m, x);
	return rc;
}

/* ---- running ------------------------------------------------------------ */

typedef struct kstep {
	kiln_kernel_fn fn;
	void **argv;
	const int64_t *syms;
} kstep_t;

static void kernel_range(void *ctx, int64_t b, int64_t e)
{
	const kstep_t *k = ctx;
	k->fn(k->argv, k->syms, b, e);
}

/* The symbols of the run whose fallback callback this thread is in. */
static _Thread_local const int64_t *tl_fb_syms;
static _Thread_local uint32_t tl_fb_nsyms;

const int64_t *kiln_fallback_syms(uint32_t *n)
{
	if (n != NULL)
		*n = tl_fb_syms != NULL ? tl_fb_nsyms : 0;
	return tl_fb_syms;
}

static int run_fallback(kiln_module_t *m, exec_t *x, uint32_t s,
			const kiln_run_opts_t *opts, char *err, size_t errlen)
{
	const kiln_art_step_t *st = &m->a->steps[s];
	if (opts == NULL || opts->fallback == NULL)
		return kiln__errf(err, errlen, KILN_EUNSUPOP,
				  "step %u: fallback op %s (node %d) needs a "
				  "fallback callback, and none was given",
				  s, st->op, (int)st->node);
	char cb_err[512] = "";
	count(&m->fallbacks);
	const int64_t *saved = tl_fb_syms;
	uint32_t saved_n = tl_fb_nsyms;
	tl_fb_syms = x->syms;
	tl_fb_nsyms = m->a->n_symbols;
	int rc = opts->fallback(opts->fallback_user, m->a, s, x->views, cb_err,
				sizeof(cb_err));
	tl_fb_syms = saved;
	tl_fb_nsyms = saved_n;
	if (rc == 0)
		return 0;
	return kiln__errf(err, errlen, rc < 0 ? rc : KILN_EINTERNAL,
			  "step %u (node %d, %s): %s", s, (int)st->node, st->op,
			  cb_err[0] ? cb_err : kiln_strerror(rc));
}

/* A buffer of n bytes (n a multiple of 64) that free() releases. Above 32
 * MiB (glibc's largest mmap threshold: every such malloc is a fresh mmap,
 * faulted in page by page) it is 2 MiB-aligned and advised for transparent
 * huge pages (THP mode "madvise", as on Debian): a fresh 64 MiB output
 * costs 32 page faults instead of 16384 and is written twice as fast the
 * first time (torch's CPU allocator does the same under
 * THP_MEM_ALLOC_ENABLE). Smaller buffers stay with malloc, which reuses
 * freed heap memory without faults. */
static void *buf_alloc(size_t n)
{
	const size_t huge = (size_t)2 << 20;
	if (n <= (size_t)32 << 20)
		return aligned_alloc(64, n);
	size_t r = (n + huge - 1) & ~(huge - 1);
	void *p = aligned_alloc(huge, r);
	if (p != NULL)
		(void)madvise(p, r, MADV_HUGEPAGE);
	return p;
}

static int execute(kiln_module_t *m, exec_t *x, const kiln_io_t *in,
		   void **out_bufs, kiln_io_t *outputs,
		   const kiln_run_opts_t *opts, int64_t arena_bytes, char *err,
		   size_t errlen)
{
	const kiln_artifact_t *a = m->a;
	/* the scratch arena: reuse the context's when it is large enough */
	size_t need = (size_t)arena_bytes;
	need = need < 64 ? 64 : (need + 63) & ~(size_t)63;
	if (x->arena_cap < need) {
		free(x->arena);
		x->arena_cap = 0;
		x->arena = buf_alloc(need);
		if (x->arena == NULL)
			return kiln__errf(err, errlen, -ENOMEM,
					  "out of memory for a %zu-byte "
					  "arena",
					  need);
		x->arena_cap = need;
		count(&m->arena_allocs);
	}
	/* buffers */
	for (uint32_t b = 0; b < a->n_buffers; b++) {
		const kiln_art_buffer_t *bf = &a->buffers[b];
		if (bf->kind == KILN_BUF_INPUT) {
			x->bufp[b] = in[bf->index].t.data;
		} else if (bf->kind == KILN_BUF_ARENA) {
			x->bufp[b] = x->arena + x->offs[b];
		} else {
			uint32_t k = bf->index;
			if (out_bufs[k] == NULL) {
				size_t n = (size_t)x->bytes[b];
				n = n < 64 ? 64 : (n + 63) & ~(size_t)63;
				out_bufs[k] = buf_alloc(n);
				if (out_bufs[k] == NULL)
					return kiln__errf(
					    err, errlen, -ENOMEM,
					    "out of memory for output "
					    "buffer %u (%zu bytes)",
					    k, n);
				x->allocated[k] = 1;
			}
			x->bufp[b] = out_bufs[k];
		}
	}
	/* views: all of them when a fallback may look, else the outputs' */
	if (m->has_fallback) {
		for (uint32_t v = 0; v < a->n_views; v++) {
			int rc = resolve_view(a, x, v, err, errlen);
			if (rc != 0)
				return rc;
		}
	} else {
		for (uint32_t i = 0; i < a->n_outputs; i++) {
			if (a->outputs[i].kind != KILN_ARG_REF)
				continue;
			int rc = resolve_view(a, x, a->outputs[i].u.ref, err,
					      errlen);
			if (rc != 0)
				return rc;
		}
	}
	for (uint32_t k = 0; k < a->n_kernels; k++)
		if (ev(a->kernels[k].extent, x->syms, &x->extents[k]) != 0 ||
		    x->extents[k] < 0)
			return eval_fail(err, errlen, "kernel", k, "extent", 0);

	kiln_pool_t *pool =
	    opts != NULL && opts->pool != NULL
		? opts->pool
		: (a->n_kernels > 0 ? kiln_pool_default() : NULL);
	bool parallel = kiln_pool_threads(pool) > 1;
	double *prof = opts != NULL ? opts->step_ms : NULL;
	for (uint32_t s = 0; s < a->n_steps; s++) {
		const kiln_art_step_t *st = &a->steps[s];
		double t0 = prof != NULL ? prof_ms() : 0;
		if (st->kind == KILN_STEP_FALLBACK) {
			int rc = run_fallback(m, x, s, opts, err, errlen);
			if (rc != 0)
				return rc;
		} else {
			int64_t ext = x->extents[st->kernel];
			if (ext <= 0)
				continue;
			for (uint32_t j = 0; j < st->n_bufs; j++)
				x->argv[j] = x->bufp[st->bufs[j]];
			kiln_kernel_fn fn = m->fns[st->kernel];
			int64_t grain = a->kernels[st->kernel].grain;
			if (!parallel || ext <= grain) {
				fn(x->argv, x->syms, 0, ext);
			} else {
				kstep_t k = {fn, x->argv, x->syms};
				kiln_pool_parallel_for(pool, ext, grain,
						       kernel_range, &k);
			}
		}
		if (prof != NULL)
			prof[s] += prof_ms() - t0;
	}
	/* outputs */
	for (uint32_t i = 0; i < a->n_outputs; i++) {
		const kiln_arg_t *o = &a->outputs[i];
		memset(&outputs[i], 0, sizeof(outputs[i]));
		if (o->kind == KILN_ARG_SYM) {
			outputs[i].kind = KILN_IO_INT;
			if (kiln_expr_eval(o->u.sym, x->syms, &outputs[i].i) !=
			    0)
				return eval_fail(err, errlen, "output", i,
						 "value", 0);
		} else {
			outputs[i].kind = KILN_IO_TENSOR;
			outputs[i].t = x->views[o->u.ref];
		}
	}
	return 0;
}

int kiln_module_run(kiln_module_t *m, const kiln_io_t *inputs,
		    uint32_t n_inputs, void **out_bufs, kiln_io_t *outputs,
		    const kiln_run_opts_t *opts, char *err, size_t errlen)
{
	const kiln_artifact_t *a = m->a;
	if ((a->n_out_buffers > 0 && out_bufs == NULL) ||
	    (a->n_outputs > 0 && outputs == NULL)) {
		count(&m->failed_runs);
		return kiln__errf(err, errlen, -EINVAL,
				  "out_bufs (%u entries) and outputs (%u "
				  "entries) must be given",
				  a->n_out_buffers, a->n_outputs);
	}
	exec_t *x = exec_get(m);
	if (x == NULL) {
		count(&m->failed_runs);
		return kiln__errf(err, errlen, -ENOMEM, "out of memory");
	}
	int64_t arena_bytes;
	int rc = prepare(m, x, inputs, n_inputs, &arena_bytes, err, errlen);
	if (rc == 0) {
		memset(x->allocated, 0, a->n_out_buffers);
		rc = execute(m, x, inputs, out_bufs, outputs, opts, arena_bytes,
			     err, errlen);
		if (rc != 0)
			for (uint32_t k = 0; k < a->n_out_buffers; k++)
				if (x->allocated[k]) {
					free(out_bufs[k]);
					out_bufs[k] = NULL;
				}
	}
	exec_put(m, x);
	count(rc == 0 ? &m->runs : &m->failed_runs);
	return rc;
}
