/*
 * hot.c — the hot map: the artifacts most recently served, in memory,
 * bounded by bytes, least recently used out first. A repeat request is
 * answered from here without a syscall.
 *
 * An open-addressing table (linear probing, tombstone-free deletion by
 * backward shift) keyed by signature, plus a doubly linked LRU list. Entries
 * hold a reference on their blob; a reply being written holds its own, so
 * eviction never frees bytes a write still reads.
 *
 * Threads: the loop thread only.
 */
#include "daemon/kilnd.h"

#include <stdlib.h>
#include <string.h>

typedef struct hot_entry {
	kilnd_blob_t *blob; /* NULL: empty slot */
	struct hot_entry *prev, *next;
} hot_entry_t;

struct kilnd_hot {
	hot_entry_t *slots;
	size_t cap; /* power of two */
	size_t count;
	uint64_t bytes, max_bytes;
	hot_entry_t *head, *tail; /* head: most recent */
};

kilnd_blob_t *kilnd_blob_new(const uint8_t sig[KILN_SIG_BYTES],
			     const void *data, size_t len, double compile_ms)
{
	kilnd_blob_t *b = malloc(sizeof(*b) + len);
	if (b == NULL)
		return NULL;
	atomic_init(&b->refs, 1);
	memcpy(b->sig, sig, KILN_SIG_BYTES);
	b->compile_ms = compile_ms;
	b->len = len;
	if (len > 0)
		memcpy(b->data, data, len);
	return b;
}

kilnd_blob_t *kilnd_blob_ref(kilnd_blob_t *b)
{
	atomic_fetch_add_explicit(&b->refs, 1, memory_order_relaxed);
	return b;
}

void kilnd_blob_unref(kilnd_blob_t *b)
{
	if (b != NULL &&
	    atomic_fetch_sub_explicit(&b->refs, 1, memory_order_acq_rel) == 1)
		free(b);
}

static size_t slot_of(const kilnd_hot_t *h, const uint8_t sig[32])
{
	uint64_t x;
	memcpy(&x, sig, 8); /* a SHA-256: already uniform */
	return (size_t)x & (h->cap - 1);
}

kilnd_hot_t *kilnd_hot_new(uint64_t max_bytes)
{
	kilnd_hot_t *h = calloc(1, sizeof(*h));
	if (h == NULL)
		return NULL;
	h->cap = 256;
	h->slots = calloc(h->cap, sizeof(*h->slots));
	if (h->slots == NULL) {
		free(h);
		return NULL;
	}
	h->max_bytes = max_bytes;
	return h;
}

static hot_entry_t *find(kilnd_hot_t *h, const uint8_t sig[32])
{
	for (size_t i = slot_of(h, sig);; i = (i + 1) & (h->cap - 1)) {
		hot_entry_t *e = &h->slots[i];
		if (e->blob == NULL)
			return NULL;
		if (memcmp(e->blob->sig, sig, 32) == 0)
			return e;
	}
}

static void lru_unlink(kilnd_hot_t *h, hot_entry_t *e)
{
	if (e->prev)
		e->prev->next = e->next;
	else
		h->head = e->next;
	if (e->next)
		e->next->prev = e->prev;
	else
		h->tail = e->prev;
	e->prev = e->next = NULL;
}

static void lru_push_front(kilnd_hot_t *h, hot_entry_t *e)
{
	e->prev = NULL;
	e->next = h->head;
	if (h->head)
		h->head->prev = e;
	h->head = e;
	if (h->tail == NULL)
		h->tail = e;
}

/* Moves the entry in slot `from` to slot `to`, fixing the list links. */
static void move_slot(kilnd_hot_t *h, hot_entry_t *from, hot_entry_t *to)
{
	*to = *from;
	if (to->prev)
		to->prev->next = to;
	else
		h->head = to;
	if (to->next)
		to->next->prev = to;
	else
		h->tail = to;
	from->blob = NULL;
	from->prev = from->next = NULL;
}

/* Removes e (backward-shift deletion keeps probe chains whole). */
static void erase(kilnd_hot_t *h, hot_entry_t *e)
{
	lru_unlink(h, e);
	h->bytes -= e->blob->len;
	h->count--;
	kilnd_blob_unref(e->blob);
	e->blob = NULL;
	size_t i = (size_t)(e - h->slots);
	for (size_t j = (i + 1) & (h->cap - 1);; j = (j + 1) & (h->cap - 1)) {
		hot_entry_t *n = &h->slots[j];
		if (n->blob == NULL)
			break;
		size_t home = slot_of(h, n->blob->sig);
		/* n may move to i when i lies cyclically in [home, j). */
		bool movable =
		    (j > i) ? (home <= i || home > j) : (home <= i && home > j);
		if (movable) {
			move_slot(h, n, &h->slots[i]);
			i = j;
		}
	}
}

static int grow(kilnd_hot_t *h)
{
	size_t cap = h->cap * 2;
	hot_entry_t *slots = calloc(cap, sizeof(*slots));
	if (slots == NULL)
		return -1;
	hot_entry_t *old = h->slots;
	hot_entry_t *order = h->tail; /* re-insert oldest first */
	h->slots = slots;
	h->cap = cap;
	h->head = h->tail = NULL;
	while (order != NULL) {
		hot_entry_t *prev = order->prev;
		size_t i = slot_of(h, order->blob->sig);
		while (h->slots[i].blob != NULL)
			i = (i + 1) & (cap - 1);
		h->slots[i].blob = order->blob;
		lru_push_front(h, &h->slots[i]);
		order = prev;
	}
	free(old);
	return 0;
}

kilnd_blob_t *kilnd_hot_get(kilnd_hot_t *h, const uint8_t sig[KILN_SIG_BYTES])
{
	hot_entry_t *e = find(h, sig);
	if (e == NULL)
		return NULL;
	lru_unlink(h, e);
	lru_push_front(h, e);
	return kilnd_blob_ref(e->blob);
}

static void shrink_to(kilnd_hot_t *h, uint64_t max)
{
	while (h->bytes > max && h->tail != NULL)
		erase(h, h->tail);
}

void kilnd_hot_put(kilnd_hot_t *h, kilnd_blob_t *b)
{
	hot_entry_t *e = find(h, b->sig);
	if (e != NULL)
		erase(h, e);
	if (b->len > h->max_bytes)
		return;
	shrink_to(h, h->max_bytes - b->len);
	if ((h->count + 1) * 4 > h->cap * 3 && grow(h) < 0)
		return; /* no memory: simply not kept */
	size_t i = slot_of(h, b->sig);
	while (h->slots[i].blob != NULL)
		i = (i + 1) & (h->cap - 1);
	h->slots[i].blob = kilnd_blob_ref(b);
	lru_push_front(h, &h->slots[i]);
	h->bytes += b->len;
	h->count++;
}

void kilnd_hot_remove(kilnd_hot_t *h, const uint8_t sig[KILN_SIG_BYTES])
{
	hot_entry_t *e = find(h, sig);
	if (e != NULL)
		erase(h, e);
}

void kilnd_hot_clear(kilnd_hot_t *h)
{
	while (h->tail != NULL) /* zero-length blobs too */
		erase(h, h->tail);
}

void kilnd_hot_set_max(kilnd_hot_t *h, uint64_t max_bytes)
{
	h->max_bytes = max_bytes;
	shrink_to(h, max_bytes);
}

uint64_t kilnd_hot_bytes(const kilnd_hot_t *h)
{
	return h->bytes;
}

uint64_t kilnd_hot_count(const kilnd_hot_t *h)
{
	return h->count;
}

void kilnd_hot_free(kilnd_hot_t *h)
{
	if (h == NULL)
		return;
	kilnd_hot_clear(h);
	free(h->slots);
	free(h);
}
