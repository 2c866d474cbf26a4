/* Intrusive AVL tree. Recursive: the depth is at most ~1.44 log2(n), so a
 * tree of a billion nodes recurses about 43 levels. */
#include <assert.h>

#include "store/store_int.h"

static int height(const fr_avl_node *n)
{
    return n != NULL ? n->h : 0;
}

static void fix(fr_avl_node *n)
{
    int a = height(n->l), b = height(n->r);
    n->h = (a > b ? a : b) + 1;
}

static fr_avl_node *rot_right(fr_avl_node *n)
{
    fr_avl_node *l = n->l;
    n->l = l->r;
    l->r = n;
    fix(n);
    fix(l);
    return l;
}

static fr_avl_node *rot_left(fr_avl_node *n)
{
    fr_avl_node *r = n->r;
    n->r = r->l;
    r->l = n;
    fix(n);
    fix(r);
    return r;
}

static fr_avl_node *balance(fr_avl_node *n)
{
    fix(n);
    int bf = height(n->l) - height(n->r);
    if (bf > 1) {
        if (height(n->l->l) < height(n->l->r))
            n->l = rot_left(n->l);
        return rot_right(n);
    }
    if (bf < -1) {
        if (height(n->r->r) < height(n->r->l))
            n->r = rot_right(n->r);
        return rot_left(n);
    }
    return n;
}

void fr_avl_init(fr_avl *t, fr_avl_cmp_fn cmp)
{
    t->root = NULL;
    t->cmp = cmp;
    t->n = 0;
}

static fr_avl_node *ins(fr_avl_node *n, fr_avl_node *x, fr_avl_cmp_fn cmp)
{
    if (n == NULL) {
        x->l = x->r = NULL;
        x->h = 1;
        return x;
    }
    int c = cmp(x, n);
    assert(c != 0);
    if (c < 0)
        n->l = ins(n->l, x, cmp);
    else
        n->r = ins(n->r, x, cmp);
    return balance(n);
}

void fr_avl_insert(fr_avl *t, fr_avl_node *x)
{
    t->root = ins(t->root, x, t->cmp);
    t->n++;
}

static fr_avl_node *take_min(fr_avl_node *n, fr_avl_node **min)
{
    if (n->l == NULL) {
        *min = n;
        return n->r;
    }
    n->l = take_min(n->l, min);
    return balance(n);
}

static fr_avl_node *rem(fr_avl_node *n, fr_avl_node *x, fr_avl_cmp_fn cmp)
{
    assert(n != NULL);
    int c = cmp(x, n);
    if (c < 0) {
        n->l = rem(n->l, x, cmp);
    } else if (c > 0) {
        n->r = rem(n->r, x, cmp);
    } else {
        assert(n == x);
        fr_avl_node *l = n->l, *r = n->r, *m;
        if (r == NULL)
            return l;
        r = take_min(r, &m);
        m->l = l;
        m->r = r;
        return balance(m);
    }
    return balance(n);
}

void fr_avl_remove(fr_avl *t, fr_avl_node *x)
{
    t->root = rem(t->root, x, t->cmp);
    t->n--;
}

fr_avl_node *fr_avl_ceil(const fr_avl *t, const fr_avl_node *probe)
{
    fr_avl_node *n = t->root, *best = NULL;
    while (n != NULL) {
        int c = t->cmp(probe, n);
        if (c == 0)
            return n;
        if (c < 0) {
            best = n;
            n = n->l;
        } else {
            n = n->r;
        }
    }
    return best;
}

fr_avl_node *fr_avl_higher(const fr_avl *t, const fr_avl_node *probe)
{
    fr_avl_node *n = t->root, *best = NULL;
    while (n != NULL) {
        if (t->cmp(probe, n) < 0) {
            best = n;
            n = n->l;
        } else {
            n = n->r;
        }
    }
    return best;
}

fr_avl_node *fr_avl_floor(const fr_avl *t, const fr_avl_node *probe)
{
    fr_avl_node *n = t->root, *best = NULL;
    while (n != NULL) {
        int c = t->cmp(probe, n);
        if (c == 0)
            return n;
        if (c > 0) {
            best = n;
            n = n->r;
        } else {
            n = n->l;
        }
    }
    return best;
}

fr_avl_node *fr_avl_first(const fr_avl *t)
{
    fr_avl_node *n = t->root;
    while (n != NULL && n->l != NULL)
        n = n->l;
    return n;
}

fr_avl_node *fr_avl_last(const fr_avl *t)
{
    fr_avl_node *n = t->root;
    while (n != NULL && n->r != NULL)
        n = n->r;
    return n;
}
