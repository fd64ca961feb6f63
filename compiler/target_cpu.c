/*
 * target_cpu.c — the x86-64 target: one TargetMachine per compiler (per
 * worker thread), verify → default<O3> → object in memory → shared object.
 *
 * LLVM is initialised once per process (pthread_once) before any compiler
 * exists; everything else is per compiler and never shared.
 *
 * Linking: the object is linked into a shared object by an external linker,
 * found at run time: GNU ld (binutils, always beside gcc). Measured here on
 * corpus graphs, ld.bfd links in 4.7-5.3 ms and LLVM 16's ld.lld in 17-22
 * ms: lld's own work is smaller, but it first loads the 100 MB libLLVM
 * shared library. lld is the fallback when binutils is absent; KILN_LINKER
 * overrides.
 *
 * libm (and, with KILN_MATH=libmvec, libmvec) is on the link line only
 * when an object calls a function that libc does not define: the f64,
 * fmod and pow/atan2 paths call libm, the default f32 math is kiln's own
 * polynomials, and none of the corpus graphs' kernels import anything but
 * dlopen/dlsym (for OpenBLAS). ld reads a shared library's whole symbol
 * table, and libm's costs 2-3 ms of a 5-7 ms link. A .so without libm
 * records no DT_NEEDED for it; its libc imports bind to the libc every
 * process has.
 */
#include "compiler/cpu.h"

#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <llvm-c/Analysis.h>
#include <llvm-c/Error.h>
#include <llvm-c/Target.h>
#include <llvm-c/TargetMachine.h>
#include <llvm-c/Transforms/PassBuilder.h>
#include <pthread.h>
#include <spawn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

static pthread_once_t llvm_once = PTHREAD_ONCE_INIT;

static void llvm_init(void)
{
	LLVMInitializeX86TargetInfo();
	LLVMInitializeX86Target();
	LLVMInitializeX86TargetMC();
	LLVMInitializeX86AsmPrinter();
	LLVMInitializeX86AsmParser();
	/* Run the pass pipeline once on an empty module, on this one thread:
	 * LLVM creates some process-wide objects (pass timers, option
	 * tables) lazily on first use, and ThreadSanitizer saw two compiler
	 * threads race to create them. */
	char *triple = LLVMGetDefaultTargetTriple();
	LLVMTargetRef target;
	char *msg = NULL;
	if (LLVMGetTargetFromTriple(triple, &target, &msg) == 0) {
		LLVMTargetMachineRef tm = LLVMCreateTargetMachine(
		    target, triple, "generic", "", LLVMCodeGenLevelAggressive,
		    LLVMRelocPIC, LLVMCodeModelDefault);
		LLVMContextRef ctx = LLVMContextCreate();
		LLVMModuleRef m =
		    LLVMModuleCreateWithNameInContext("warm", ctx);
		LLVMPassBuilderOptionsRef o = LLVMCreatePassBuilderOptions();
		LLVMErrorRef e = LLVMRunPasses(m, "default<O3>", tm, o);
		if (e != NULL)
			LLVMConsumeError(e);
		LLVMDisposePassBuilderOptions(o);
		LLVMDisposeModule(m);
		LLVMContextDispose(ctx);
		if (tm != NULL)
			LLVMDisposeTargetMachine(tm);
	}
	LLVMDisposeMessage(msg);
	LLVMDisposeMessage(triple);
}

void kiln__llvm_init(void)
{
	pthread_once(&llvm_once, llvm_init);
}

double kiln__now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static bool exists_x(const char *p)
{
	return access(p, X_OK) == 0;
}

static void find_linker(cpu_target_t *t)
{
	const char *env = getenv("KILN_LINKER");
	if (env != NULL && env[0] != '\0') {
		snprintf(t->linker, sizeof(t->linker), "%s", env);
		t->linker_is_lld = strstr(env, "lld") != NULL;
		return;
	}
	static const char *const cands[] = {
	    "/usr/bin/ld.bfd", "/usr/bin/ld", "/bin/ld",
	    "/usr/lib/llvm-16/bin/ld.lld", "/usr/bin/ld.lld"};
	for (size_t i = 0; i < sizeof(cands) / sizeof(cands[0]); i++)
		if (exists_x(cands[i])) {
			snprintf(t->linker, sizeof(t->linker), "%s", cands[i]);
			t->linker_is_lld = strstr(cands[i], "lld") != NULL;
			return;
		}
	t->linker[0] = '\0';
}

int cpu_target_init(cpu_target_t *t, const kiln_target_t *want, char *err,
		    size_t errlen)
{
	kiln__llvm_init();
	memset(t, 0, sizeof(*t));
	char *triple = LLVMGetDefaultTargetTriple();
	char *emsg = NULL;
	LLVMTargetRef target;
	if (LLVMGetTargetFromTriple(triple, &target, &emsg) != 0) {
		int rc = kiln__errf(err, errlen, KILN_EINTERNAL,
				    "no LLVM target for %s: %s", triple,
				    emsg ? emsg : "?");
		LLVMDisposeMessage(emsg);
		LLVMDisposeMessage(triple);
		return rc;
	}
	char *cpu = LLVMGetHostCPUName();
	char *feat = LLVMGetHostCPUFeatures();
	snprintf(t->triple, sizeof(t->triple), "%s", triple);
	snprintf(t->cpu, sizeof(t->cpu), "%s", cpu);
	memset(&t->target, 0, sizeof(t->target));
	strcpy(t->target.backend, "cpu");
	strcpy(t->target.arch, "x86-64");
	if (want != NULL && want->features[0] != '\0')
		snprintf(t->target.features, sizeof(t->target.features), "%s",
			 want->features);
	else
		snprintf(t->target.features, sizeof(t->target.features), "%s",
			 feat);
	if (want != NULL && want->arch[0] != '\0' &&
	    strcmp(want->arch, "x86-64") != 0) {
		LLVMDisposeMessage(cpu);
		LLVMDisposeMessage(feat);
		LLVMDisposeMessage(triple);
		return kiln__errf(err, errlen, KILN_EBADREQ,
				  "cpu arch \"%s\" is not supported (x86-64)",
				  want->arch);
	}
	t->tm = LLVMCreateTargetMachine(target, triple, cpu, t->target.features,
					LLVMCodeGenLevelAggressive,
					LLVMRelocPIC, LLVMCodeModelDefault);
	LLVMDisposeMessage(cpu);
	LLVMDisposeMessage(feat);
	LLVMDisposeMessage(triple);
	if (t->tm == NULL)
		return kiln__errf(err, errlen, KILN_EINTERNAL,
				  "cannot create an LLVM TargetMachine");
	const char *f = t->target.features;
	t->vec_width = strstr(f, "+avx512f") ? 16 : strstr(f, "+avx") ? 8 : 4;
	const char *math = getenv("KILN_MATH");
	if (math != NULL && math[0] != '\0' && strcmp(math, "poly") != 0) {
		static const char mvec[] = "/lib/x86_64-linux-gnu/libmvec.so.1";
		int rc = 0;
		if (strcmp(math, "libmvec") != 0)
			rc =
			    kiln__errf(err, errlen, KILN_EBADREQ,
				       "KILN_MATH=\"%.40s\": expected \"poly\" "
				       "(the default) or \"libmvec\"",
				       math);
		else if (access(mvec, R_OK) != 0)
			rc = kiln__errf(err, errlen, KILN_EBADREQ,
					"KILN_MATH=libmvec, but %s is missing",
					mvec);
		if (rc != 0) {
			LLVMDisposeTargetMachine(t->tm);
			t->tm = NULL;
			return rc;
		}
		snprintf(t->libmvec, sizeof(t->libmvec), "%s", mvec);
	}
	find_linker(t);
	if (t->linker[0] == '\0') {
		LLVMDisposeTargetMachine(t->tm);
		t->tm = NULL;
		return kiln__errf(err, errlen, KILN_EINTERNAL,
				  "no linker found (install lld-16 or "
				  "binutils, or set KILN_LINKER)");
	}
	return 0;
}

LLVMTargetMachineRef cpu_tm(cpu_target_t *t, int i)
{
	if (i == 0)
		return t->tm;
	if (i < 0 || i >= CPU_PAR_MAX)
		return NULL;
	if (t->par_tm[i] == NULL) {
		LLVMTargetRef target;
		char *msg = NULL;
		if (LLVMGetTargetFromTriple(t->triple, &target, &msg) != 0) {
			LLVMDisposeMessage(msg);
			return NULL;
		}
		t->par_tm[i] = LLVMCreateTargetMachine(
		    target, t->triple, t->cpu, t->target.features,
		    LLVMCodeGenLevelAggressive, LLVMRelocPIC,
		    LLVMCodeModelDefault);
	}
	return t->par_tm[i];
}

void cpu_target_free(cpu_target_t *t)
{
	for (int i = 1; i < CPU_PAR_MAX; i++) {
		if (t->par_tm[i] != NULL)
			LLVMDisposeTargetMachine(t->par_tm[i]);
		t->par_tm[i] = NULL;
	}
	if (t->tm != NULL)
		LLVMDisposeTargetMachine(t->tm);
	t->tm = NULL;
}

void cpu_prepare_module(cpu_target_t *t, LLVMModuleRef m)
{
	LLVMSetTarget(m, t->triple);
	LLVMTargetDataRef td = LLVMCreateTargetDataLayout(t->tm);
	char *dl = LLVMCopyStringRepOfTargetData(td);
	LLVMSetDataLayout(m, dl);
	LLVMDisposeMessage(dl);
	LLVMDisposeTargetData(td);
}

int cpu_optimize(cpu_target_t *t, LLVMTargetMachineRef tm, LLVMModuleRef m,
		 char *err, size_t errlen)
{
	(void)t;
	char *msg = NULL;
	if (LLVMVerifyModule(m, LLVMReturnStatusAction, &msg) != 0) {
		int rc = kiln__errf(err, errlen, KILN_ECOMPILE,
				    "LLVM verifier: %.400s", msg ? msg : "?");
		LLVMDisposeMessage(msg);
		return rc;
	}
	LLVMDisposeMessage(msg);
	LLVMPassBuilderOptionsRef o = LLVMCreatePassBuilderOptions();
	/* kiln vectorizes explicitly (codegen.c); LLVM's loop and SLP
	 * vectorizers would only re-vectorize the scalar tails, at a third of
	 * the compile time. KILN_LLVM_VECTORIZE=1 asks for them back. (Seen
	 * 2026-12-02 with LLVM 16: O3 loop-vectorized codegen's scalar row
	 * loops with the option off too, and the option left mobilenet_v2's
	 * module byte-identical; compiler/README.md.) */
	const char *lv = getenv("KILN_LLVM_VECTORIZE");
	int vec = lv != NULL && lv[0] == '1';
	LLVMPassBuilderOptionsSetLoopVectorization(o, vec);
	LLVMPassBuilderOptionsSetSLPVectorization(o, vec);
	const char *ur = getenv("KILN_LLVM_UNROLL");
	if (ur != NULL)
		LLVMPassBuilderOptionsSetLoopUnrolling(o, ur[0] == '1');
	/* KILN_LLVM_PASSES: another pipeline (opt's -passes syntax), for
	 * measuring one against O3 */
	const char *pl = getenv("KILN_LLVM_PASSES");
	LLVMErrorRef e = LLVMRunPasses(
	    m, pl != NULL && pl[0] != '\0' ? pl : "default<O3>", tm, o);
	LLVMDisposePassBuilderOptions(o);
	if (e != NULL) {
		char *em = LLVMGetErrorMessage(e);
		int rc = kiln__errf(err, errlen, KILN_ECOMPILE,
				    "LLVM passes: %.400s", em);
		LLVMDisposeErrorMessage(em);
		return rc;
	}
	return 0;
}

int cpu_emit(LLVMTargetMachineRef tm, LLVMModuleRef m, bool assembly,
	     uint8_t **out, size_t *len, char *err, size_t errlen)
{
	char *msg = NULL;
	LLVMMemoryBufferRef buf = NULL;
	if (LLVMTargetMachineEmitToMemoryBuffer(
		tm, m, assembly ? LLVMAssemblyFile : LLVMObjectFile, &msg,
		&buf) != 0) {
		int rc = kiln__errf(err, errlen, KILN_ECOMPILE,
				    "LLVM codegen: %.400s", msg ? msg : "?");
		LLVMDisposeMessage(msg);
		return rc;
	}
	size_t n = LLVMGetBufferSize(buf);
	uint8_t *p = malloc(n + 1);
	if (p == NULL) {
		LLVMDisposeMemoryBuffer(buf);
		return -ENOMEM;
	}
	memcpy(p, LLVMGetBufferStart(buf), n);
	p[n] = 0;
	LLVMDisposeMemoryBuffer(buf);
	*out = p;
	*len = n;
	return 0;
}

static int write_file(const char *path, const uint8_t *p, size_t n)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0)
		return -errno;
	size_t off = 0;
	while (off < n) {
		ssize_t w = write(fd, p + off, n - off);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			int rc = -errno;
			close(fd);
			return rc;
		}
		off += (size_t)w;
	}
	return close(fd) == 0 ? 0 : -errno;
}

static int read_file(const char *path, uint8_t **out, size_t *len)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	struct stat st;
	if (fstat(fd, &st) != 0) {
		int rc = -errno;
		close(fd);
		return rc;
	}
	uint8_t *p = malloc((size_t)st.st_size + 1);
	if (p == NULL) {
		close(fd);
		return -ENOMEM;
	}
	size_t off = 0;
	while (off < (size_t)st.st_size) {
		ssize_t r = read(fd, p + off, (size_t)st.st_size - off);
		if (r <= 0) {
			if (r < 0 && errno == EINTR)
				continue;
			int rc = r < 0 ? -errno : -EIO;
			free(p);
			close(fd);
			return rc;
		}
		off += (size_t)r;
	}
	close(fd);
	*out = p;
	*len = off;
	return 0;
}

static void *libc_handle;
static pthread_once_t libc_once = PTHREAD_ONCE_INIT;

static void libc_open(void)
{
	libc_handle = dlopen("libc.so.6", RTLD_LAZY | RTLD_NOLOAD);
}

/* Whether the ELF64 relocatable object p[0..n) has an undefined global or
 * weak symbol that libc does not define (so the link needs libm or
 * libmvec): bit 0 for a libm name, bit 1 for a libmvec one (_ZGV...).
 * An object it cannot read gets both bits: linking a library the code
 * does not use costs time, leaving out one it does breaks the load. */
int cpu_object_imports(const uint8_t *p, size_t n)
{
	const int all = CPU_IMPORTS_LIBM | CPU_IMPORTS_LIBMVEC;
	Elf64_Ehdr eh;
	if (n < sizeof(eh))
		return all;
	memcpy(&eh, p, sizeof(eh));
	if (memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0 ||
	    eh.e_ident[EI_CLASS] != ELFCLASS64 ||
	    eh.e_shentsize != sizeof(Elf64_Shdr) || eh.e_shoff > n ||
	    (n - eh.e_shoff) / sizeof(Elf64_Shdr) < eh.e_shnum)
		return all;
	pthread_once(&libc_once, libc_open);
	int need = 0;
	for (unsigned i = 0; i < eh.e_shnum; i++) {
		Elf64_Shdr sh, st;
		memcpy(&sh, p + eh.e_shoff + i * sizeof(sh), sizeof(sh));
		if (sh.sh_type != SHT_SYMTAB)
			continue;
		if (sh.sh_link >= eh.e_shnum || sh.sh_offset > n ||
		    sh.sh_size > n - sh.sh_offset)
			return all;
		memcpy(&st, p + eh.e_shoff + sh.sh_link * sizeof(st),
		       sizeof(st));
		if (st.sh_offset > n || st.sh_size > n - st.sh_offset ||
		    st.sh_size == 0 || p[st.sh_offset + st.sh_size - 1] != 0)
			return all;
		const char *names = (const char *)p + st.sh_offset;
		for (size_t k = 0; k + sizeof(Elf64_Sym) <= sh.sh_size;
		     k += sizeof(Elf64_Sym)) {
			Elf64_Sym sym;
			memcpy(&sym, p + sh.sh_offset + k, sizeof(sym));
			int bind = ELF64_ST_BIND(sym.st_info);
			if (sym.st_shndx != SHN_UNDEF || sym.st_name == 0 ||
			    (bind != STB_GLOBAL && bind != STB_WEAK))
				continue;
			if (sym.st_name >= st.sh_size)
				return all;
			const char *name = names + sym.st_name;
			if (libc_handle != NULL &&
			    dlsym(libc_handle, name) != NULL)
				continue;
			need |= strncmp(name, "_ZGV", 4) == 0
				    ? CPU_IMPORTS_LIBMVEC
				    : CPU_IMPORTS_LIBM;
		}
	}
	return need;
}

int cpu_link(cpu_target_t *t, int n, uint8_t *const *objs, const size_t *lens,
	     uint8_t **so, size_t *solen, char *err, size_t errlen)
{
	const char *tmp = getenv("TMPDIR");
	char dir[512];
	snprintf(dir, sizeof(dir), "%s/kiln-link-XXXXXX",
		 tmp && tmp[0] ? tmp : "/tmp");
	if (mkdtemp(dir) == NULL)
		return kiln__errf(err, errlen, -errno,
				  "link: cannot create a temp dir: %s",
				  strerror(errno));
	if (n < 1 || n > CPU_PAR_MAX)
		return kiln__errf(err, errlen, KILN_EINTERNAL,
				  "link: %d objects", n);
	char o[CPU_PAR_MAX][600], s[600], log[600];
	snprintf(s, sizeof(s), "%s/k.so", dir);
	snprintf(log, sizeof(log), "%s/ld.log", dir);
	int rc = 0, written = 0;
	for (; written < n && rc == 0; written++) {
		snprintf(o[written], sizeof(o[written]), "%s/k%d.o", dir,
			 written);
		rc = write_file(o[written], objs[written], lens[written]);
	}
	if (rc != 0) {
		kiln__errf(err, errlen, rc, "link: writing the object: %s",
			   strerror(-rc));
		goto out;
	}
	int imports = 0;
	for (int i = 0; i < n; i++)
		imports |= cpu_object_imports(objs[i], lens[i]);
	const char *libm =
	    (imports != 0 &&
	     access("/lib/x86_64-linux-gnu/libm.so.6", R_OK) == 0)
		? "/lib/x86_64-linux-gnu/libm.so.6"
		: NULL;
	char *argv[16 + CPU_PAR_MAX];
	int ac = 0;
	argv[ac++] = t->linker;
	argv[ac++] = "-shared";
	argv[ac++] = "--hash-style=gnu";
	argv[ac++] = "-z";
	argv[ac++] = "noexecstack";
	argv[ac++] = "-o";
	argv[ac++] = s;
	for (int i = 0; i < n; i++)
		argv[ac++] = o[i];
	if (libm != NULL)
		argv[ac++] = (char *)libm;
	if (t->libmvec[0] != '\0' && (imports & CPU_IMPORTS_LIBMVEC))
		argv[ac++] = t->libmvec;
	argv[ac] = NULL;
	posix_spawn_file_actions_t fa;
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
	posix_spawn_file_actions_addopen(&fa, 2, log,
					 O_WRONLY | O_CREAT | O_TRUNC, 0600);
	pid_t pid;
	int sp = posix_spawn(&pid, t->linker, &fa, NULL, argv, environ);
	posix_spawn_file_actions_destroy(&fa);
	if (sp != 0) {
		rc = kiln__errf(err, errlen, KILN_ECOMPILE,
				"link: cannot run %s: %s", t->linker,
				strerror(sp));
		goto out;
	}
	int status;
	while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
		;
	if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
		uint8_t *lg = NULL;
		size_t ll = 0;
		read_file(log, &lg, &ll);
		rc = kiln__errf(err, errlen, KILN_ECOMPILE,
				"link: %s failed: %.300s", t->linker,
				lg ? (char *)lg : "");
		free(lg);
		goto out;
	}
	rc = read_file(s, so, solen);
	if (rc != 0)
		kiln__errf(err, errlen, rc, "link: reading the .so: %s",
			   strerror(-rc));
out:
	for (int i = 0; i < written; i++)
		unlink(o[i]);
	unlink(s);
	unlink(log);
	rmdir(dir);
	return rc;
}
