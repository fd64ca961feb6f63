/*
 * regress_main.c — runs LLVMFuzzerTestOneInput over every file of the given
 * directories (or files), so any build, gcc included, replays the fuzz
 * corpus as a test: `fuzz_protocol_regress DIR|FILE...`.
 *
 * Each input is read into a buffer of exactly its size, so the sanitizers
 * of an ASan build see overreads as they would under libFuzzer. A finding
 * aborts (the test fails); the file being run was printed just before.
 * Exit status: 0 when every input ran, 1 when an argument could not be read
 * or held no input at all.
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int run_file(const char *path, size_t *bytes)
{
	FILE *f = fopen(path, "rb");
	if (f == NULL) {
		perror(path);
		return -1;
	}
	struct stat st;
	if (fstat(fileno(f), &st) != 0 || st.st_size < 0) {
		perror(path);
		fclose(f);
		return -1;
	}
	size_t n = (size_t)st.st_size;
	uint8_t *buf = malloc(n ? n : 1);
	if (buf == NULL || fread(buf, 1, n, f) != n) {
		fprintf(stderr, "%s: read failed\n", path);
		free(buf);
		fclose(f);
		return -1;
	}
	fclose(f);
	printf("%s (%zu bytes)\n", path, n);
	fflush(stdout);
	/* Zero-size inputs are handed over as libFuzzer does: a valid pointer
	 * to no bytes. */
	LLVMFuzzerTestOneInput(buf, n);
	free(buf);
	*bytes += n;
	return 0;
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Runs every regular, non-hidden file of dir in name order. */
static int run_dir(const char *dir, size_t *files, size_t *bytes)
{
	DIR *d = opendir(dir);
	if (d == NULL) {
		perror(dir);
		return -1;
	}
	char **names = NULL;
	size_t n = 0, cap = 0;
	struct dirent *e;
	int rc = 0;
	while ((e = readdir(d)) != NULL) {
		if (e->d_name[0] == '.')
			continue;
		if (n == cap) {
			cap = cap ? 2 * cap : 64;
			char **nn = realloc(names, cap * sizeof(*names));
			if (nn == NULL) {
				rc = -1;
				break;
			}
			names = nn;
		}
		size_t len = strlen(dir) + strlen(e->d_name) + 2;
		names[n] = malloc(len);
		if (names[n] == NULL) {
			rc = -1;
			break;
		}
		snprintf(names[n], len, "%s/%s", dir, e->d_name);
		n++;
	}
	closedir(d);
	if (names != NULL)
		qsort(names, n, sizeof(*names), cmp_str);
	size_t ran = 0;
	for (size_t i = 0; i < n && rc == 0; i++) {
		struct stat st;
		if (stat(names[i], &st) != 0 || !S_ISREG(st.st_mode))
			continue;
		if (run_file(names[i], bytes) != 0)
			rc = -1;
		else
			ran++;
	}
	for (size_t i = 0; i < n; i++)
		free(names[i]);
	free(names);
	if (rc == 0 && ran == 0) {
		fprintf(stderr, "%s: no inputs\n", dir);
		rc = -1;
	}
	*files += ran;
	return rc;
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: %s DIR|FILE...\n", argv[0]);
		return 2;
	}
	size_t files = 0, bytes = 0;
	int failed = 0;
	for (int i = 1; i < argc; i++) {
		struct stat st;
		if (stat(argv[i], &st) != 0) {
			perror(argv[i]);
			failed = 1;
		} else if (S_ISDIR(st.st_mode)) {
			if (run_dir(argv[i], &files, &bytes) != 0)
				failed = 1;
		} else if (run_file(argv[i], &bytes) != 0) {
			failed = 1;
		} else {
			files++;
		}
	}
	printf("fuzz_protocol_regress: %zu inputs, %zu bytes%s\n", files, bytes,
	       failed ? ", some arguments could not be read" : "");
	return failed;
}
