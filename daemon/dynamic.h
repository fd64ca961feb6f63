/*
 * dynamic.h — automatic dynamic shapes (dynamic.c): generalize two static
 * graphs of one structure into a symbolic one; test whether a static graph
 * is an instance of it.
 */
#ifndef KILND_DYNAMIC_H
#define KILND_DYNAMIC_H

#include "protocol/protocol.h"

/*
 * A new graph (*out, kiln_graph_free) equal to a except that the sizes,
 * strides and int arguments that differ between a and b are expressions
 * over new symbols bound by the inputs' sizes. a == b asks for duck sizing
 * from one sample: every input size >= 2 becomes a symbol (equal sizes
 * share one). Errors (KILN_EINVGRAPH, KILN_ETOOLARGE, -ENOMEM) say why the
 * graphs cannot be generalized; err gets the reason.
 */
int kilnd_generalize(const kiln_graph_t *a, const kiln_graph_t *b,
		     const kiln_limits_t *lim, kiln_graph_t **out, char *err,
		     size_t errlen);

/* A copy of g (through its wire form). */
int kilnd_graph_clone(const kiln_graph_t *g, const kiln_limits_t *lim,
		      kiln_graph_t **out, char *err, size_t errlen);

/* Whether the static graph g (same structure hash as gg) is gg with its
 * symbols bound to g's input sizes: then gg's artifact computes g. */
bool kilnd_instance_of(const kiln_graph_t *gg, const kiln_graph_t *g);

#endif /* KILND_DYNAMIC_H */
