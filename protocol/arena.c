/*
 * arena.c — bump allocator: a linked list of blocks, each at least twice the
 * previous one, all freed together.
 *
 * Invariants: every pointer returned is 16-byte aligned; blocks are never
 * moved. One owner thread per arena.
 */
#include "protocol/protocol.h"

#include <stdlib.h>
#include <string.h>

typedef struct block {
	struct block *next;
	size_t size, used;
	_Alignas(16) unsigned char data[];
} block_t;

struct kiln_arena {
	block_t *head;
	size_t next_size;
	size_t total;
};

kiln_arena_t *kiln_arena_new(size_t first_block)
{
	kiln_arena_t *a = calloc(1, sizeof(*a));
	if (a == NULL)
		return NULL;
	a->next_size = first_block < 256 ? 256 : first_block;
	return a;
}

void kiln_arena_free(kiln_arena_t *a)
{
	if (a == NULL)
		return;
	block_t *b = a->head;
	while (b != NULL) {
		block_t *next = b->next;
		free(b);
		b = next;
	}
	free(a);
}

void *kiln_arena_alloc(kiln_arena_t *a, size_t n)
{
	if (n > ((size_t)1 << 40))
		return NULL;
	n = (n + 15) & ~(size_t)15;
	if (n == 0)
		n = 16;
	block_t *b = a->head;
	if (b == NULL || b->size - b->used < n) {
		size_t size = a->next_size;
		while (size < n)
			size *= 2;
		b = malloc(sizeof(block_t) + size);
		if (b == NULL)
			return NULL;
		b->size = size;
		b->used = 0;
		b->next = a->head;
		a->head = b;
		if (a->next_size < ((size_t)1 << 24))
			a->next_size *= 2;
	}
	void *p = b->data + b->used;
	b->used += n;
	a->total += n;
	return p;
}

void *kiln_arena_calloc(kiln_arena_t *a, size_t n, size_t sz)
{
	if (sz != 0 && n > SIZE_MAX / sz)
		return NULL;
	void *p = kiln_arena_alloc(a, n * sz);
	if (p != NULL)
		memset(p, 0, n * sz);
	return p;
}

char *kiln_arena_strndup(kiln_arena_t *a, const char *s, size_t len)
{
	char *p = kiln_arena_alloc(a, len + 1);
	if (p == NULL)
		return NULL;
	memcpy(p, s, len);
	p[len] = '\0';
	return p;
}

size_t kiln_arena_used(const kiln_arena_t *a)
{
	return a->total;
}
