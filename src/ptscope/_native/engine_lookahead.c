/* Resuming in recursion, when names cannot tell: a landing in one of several activations
 * that armed the same resume point (setjmp at one call site of a recursive function) is
 * held, with the thread's events after it, while each event is followed on every stack
 * it may run on (a hypothesis per candidate, forking at a longjmp), until they all come
 * from one candidate; then the landing goes there and the held events run as if never
 * held (engine.py: _look_ahead, _follow, _follow_on, _follow_jump, _settle; the rules in
 * docs/architecture.md, "Resuming in recursion").
 */
#include "engine_internal.h"

/* engine.py: _look_ahead (a landing at dst in frame fi of context ci: held if farther
 * activations armed the same resume point) */
bool look_ahead(Engine *e, Thread *th, size_t ci, size_t fi, int32_t dst, int64_t t)
{
	Ctx *c = th->ctxs[ci];
	uint64_t ip = e->loc_ip[dst];
	int32_t fn = e->loc_fn[dst];
	if (!resumes_at(th, c->frames[fi].ix, ip))
		return false;
	Lookahead *l = &th->look;
	l->ncand = 0;
	for (size_t j = fi + 1; j-- > 0;) {
		if (j != fi && (c->frames[j].fn != fn || !resumes_at(th, c->frames[j].ix, ip)))
			continue;
		if (l->ncand == l->capcand)
			l->cand = grow(e, l->cand, &l->capcand, l->ncand + 1, sizeof(ptrdiff_t));
		l->cand[l->ncand++] = (ptrdiff_t)j;
	}
	if (l->ncand < 2)
		return false;
	/* Those still inside the call their setjmp protects first (a stable partition). */
	size_t inside = 0;
	for (size_t k = 0; k < l->ncand; k++) {
		if (inside_guard(th, c, (size_t)l->cand[k])) {
			ptrdiff_t j = l->cand[k];
			memmove(&l->cand[inside + 1], &l->cand[inside], (k - inside) * sizeof(ptrdiff_t));
			l->cand[inside++] = j;
		}
	}
	l->hyp = grow(e, l->hyp, &l->caphyp, l->ncand, sizeof(Hypothesis));
	for (size_t k = 0; k < l->ncand; k++)
		l->hyp[k] = (Hypothesis){k, l->cand[k], NULL, 0, 0};
	l->nhyp = l->ncand;
	l->nearest = 0;
	l->on = true;
	l->ci = ci;
	l->t = t;
	l->nev = l->nlines = 0;
	return true;
}

static void push_above(Engine *e, Hypothesis *h, int32_t fn, uint64_t resume)
{
	if (h->nabove == h->capabove)
		h->above = grow(e, h->above, &h->capabove, h->nabove + 1, sizeof(Pushed));
	h->above[h->nabove++] = (Pushed){fn, resume};
}

/* Adds a hypothesis to the list being built (taking over its frames). */
static void keep_hypothesis(Engine *e, Lookahead *l, Hypothesis h)
{
	if (l->nnext == l->capnext)
		l->next = grow(e, l->next, &l->capnext, l->nnext + 1, sizeof(Hypothesis));
	l->next[l->nnext++] = h;
}

/* A new hypothesis: h's candidate with top, and the first nabove frames h pushed. */
static void fork_hypothesis(Engine *e, Lookahead *l, const Hypothesis *h, ptrdiff_t top,
			    size_t nabove)
{
	Hypothesis n = {h->cand, top, NULL, 0, 0};
	if (nabove) {
		n.above = grow(e, NULL, &n.capabove, nabove, sizeof(Pushed));
		memcpy(n.above, h->above, nabove * sizeof(Pushed));
		n.nabove = nabove;
	}
	keep_hypothesis(e, l, n);
}

/* engine.py: _follow_jump (a jump into the middle of a function among the held events: to
 * every frame armed at dst, pushed since the landing or below it; if none is, to the frame
 * resumed_frame picks; if none is of its function, the frame on top is replaced). Adds what
 * h becomes to l->next; false: past an untraced gap, or replacing the landed frame. */
static bool follow_jump(Engine *e, Thread *th, Lookahead *l, Hypothesis *h, int32_t dst)
{
	int32_t fn = e->loc_fn[dst];
	uint64_t ip = e->loc_ip[dst];
	ptrdiff_t nearest = -1;
	size_t armed = 0;
	bool gap = false;
	for (size_t a = h->nabove; a-- > 0;) {
		if (h->above[a].fn < 0) {
			if (nearest < 0)
				return false; /* past an untraced gap: what ran there is unknown */
			gap = true;
			break;
		}
		if (h->above[a].fn == fn) {
			if (nearest < 0)
				nearest = (ptrdiff_t)a;
			if (h->above[a].resume == ip) {
				fork_hypothesis(e, l, h, h->top, a + 1);
				armed++;
			}
		}
	}
	Ctx *c = th->ctxs[l->ci];
	if (!gap) {
		for (ptrdiff_t j = h->top; j >= 0; j--) {
			if (c->frames[j].fn == fn && resumes_at(th, c->frames[j].ix, ip)) {
				fork_hypothesis(e, l, h, j, 0);
				armed++;
			}
		}
	}
	if (armed) {
		free(h->above);
		return true;
	}
	if (nearest >= 0) {
		h->nabove = (size_t)nearest + 1;
		keep_hypothesis(e, l, *h);
		return true;
	}
	ptrdiff_t j = resumed_frame(e, th, c, h->top, fn, dst);
	if (j >= 0) {
		h->top = j;
		h->nabove = 0;
	} else if (h->nabove) {
		h->above[h->nabove - 1] = (Pushed){fn, 0}; /* into an unrelated function */
	} else {
		return false; /* it replaces the landed frame */
	}
	keep_hypothesis(e, l, *h);
	return true;
}

/* engine.py: _follow_on. Adds what h becomes after the event to l->next (nothing if the event
 * does not fit it); false: an event this cannot follow (h is then left as it was). */
static bool follow_on(Engine *e, Thread *th, Lookahead *l, Hypothesis *h, const HeldEvent *ev)
{
	if (ev->state == S_END) {
		push_above(e, h, -1, 0); /* an untraced gap: tracing resumes on top of it */
		keep_hypothesis(e, l, *h);
		return true;
	}
	if (ev->state == S_START) {
		if (!h->nabove || h->above[h->nabove - 1].fn >= 0)
			return false;
		h->nabove--;
		keep_hypothesis(e, l, *h);
		return true;
	}
	int32_t fn = e->loc_fn[ev->dst], sfn = e->loc_fn[ev->src];
	uint64_t dip = e->loc_ip[ev->dst], sip = e->loc_ip[ev->src];
	switch (ev->kind) {
	case K_CALL:
		if (!(fn == sfn && dip > sip && dip - sip <= MAX_INSN))
			push_above(e, h, fn, 0);
		keep_hypothesis(e, l, *h);
		return true;
	case K_RETURN: {
		if (h->nabove) {
			if (h->above[h->nabove - 1].fn < 0)
				return false;
			h->nabove--;
			int32_t caller = h->nabove ? h->above[h->nabove - 1].fn
						   : th->ctxs[l->ci]->frames[h->top].fn;
			if (caller >= 0 && caller != fn) {
				free(h->above); /* not to its caller: not this stack */
				return true;
			}
			if ((fn_flags(e, sfn) & FN_SETJMP) && h->nabove && caller >= 0)
				h->above[h->nabove - 1].resume = dip; /* a resume point armed since */
			keep_hypothesis(e, l, *h);
			return true;
		}
		if (fn_flags(e, sfn) & FN_SPECIAL_RETURN)
			return false;
		Ctx *c = th->ctxs[l->ci];
		ptrdiff_t top = h->top;
		if (top >= 1 && c->frames[top - 1].fn == fn && after_call(th, c->frames[top].ix, dip)) {
			h->top = top - 1;
			keep_hypothesis(e, l, *h);
		} else {
			free(h->above);
		}
		return true;
	}
	case K_INLINE: /* no branch: every stack as it was */
		keep_hypothesis(e, l, *h);
		return true;
	case K_JUMP:
	case K_CJUMP:
		if (fn == sfn) {
			keep_hypothesis(e, l, *h);
			return true;
		}
		if (h->nabove && h->above[h->nabove - 1].fn >= 0 && e->loc_off[ev->dst] == 0) {
			h->above[h->nabove - 1] = (Pushed){fn, 0}; /* a tail call above the landing */
			keep_hypothesis(e, l, *h);
			return true;
		}
		if (e->loc_off[ev->dst] > 0)
			return follow_jump(e, th, l, h, ev->dst);
		return false;
	default:
		return false;
	}
}

static bool same_stack(const Hypothesis *a, const Hypothesis *b)
{
	if (a->top != b->top || a->nabove != b->nabove)
		return false;
	for (size_t k = 0; k < a->nabove; k++) /* (not memcmp: Pushed has padding) */
		if (a->above[k].fn != b->above[k].fn || a->above[k].resume != b->above[k].resume)
			return false;
	return true;
}

/* engine.py: _follow (false: an event the stacks cannot follow; the landing is then settled on
 * l->nearest, as the events before it left it) */
static bool follow(Engine *e, Thread *th, const HeldEvent *ev)
{
	Lookahead *l = &th->look;
	if (ev->kind == K_HELD_COUNTER || ev->kind == K_HELD_BREAK)
		return true; /* no branch: every stack as it was */
	if (ev->in_tx || (ev->state != S_NONE && ev->state != S_START && ev->state != S_END))
		return false;
	bool ok = true;
	l->nnext = 0;
	for (size_t i = 0; i < l->nhyp; i++) {
		if (ok)
			ok = follow_on(e, th, l, &l->hyp[i], ev);
		if (!ok)
			free(l->hyp[i].above);
	}
	Hypothesis *tmp = l->hyp;
	size_t cap = l->caphyp;
	l->hyp = l->next;
	l->caphyp = l->capnext;
	l->nhyp = l->nnext;
	l->next = tmp;
	l->capnext = cap;
	l->nnext = 0;
	if (!ok || !l->nhyp)
		return false; /* (nothing fits: a jump into a cold part) */
	if (l->nhyp > 1 && (ev->kind == K_JUMP || ev->kind == K_CJUMP) && e->loc_off[ev->dst] > 0) {
		/* A longjmp may leave the same stack twice: what follows fits both alike, so only
		 * the nearer candidate's can be the one chosen. */
		size_t n = 0;
		for (size_t i = 0; i < l->nhyp; i++) {
			size_t k = 0;
			while (k < n && !same_stack(&l->hyp[k], &l->hyp[i]))
				k++;
			if (k == n) {
				l->hyp[n++] = l->hyp[i];
				continue;
			}
			if (l->hyp[i].cand < l->hyp[k].cand) {
				Hypothesis t = l->hyp[k];
				l->hyp[k] = l->hyp[i];
				l->hyp[i] = t;
			}
			free(l->hyp[i].above);
		}
		l->nhyp = n;
		if (n > MAX_HYPOTHESES)
			return false;
	}
	l->nearest = l->hyp[0].cand;
	for (size_t i = 1; i < l->nhyp; i++)
		if (l->hyp[i].cand < l->nearest)
			l->nearest = l->hyp[i].cand;
	return true;
}

/* engine.py: _Lookahead.decided (the stacks come from one candidate, or are the same) */
static bool decided(const Lookahead *l)
{
	bool one = true, same = true;
	for (size_t i = 1; i < l->nhyp; i++) {
		one = one && l->hyp[i].cand == l->hyp[0].cand;
		same = same && same_stack(&l->hyp[i], &l->hyp[0]);
	}
	return one || same;
}

/* engine.py: _settle */
static void settle(Engine *e, Thread *th)
{
	Lookahead *l = &th->look;
	if (!l->on)
		return;
	l->on = false;
	ptrdiff_t fi = l->cand[l->nearest];
	for (size_t i = 0; i < l->nhyp; i++)
		free(l->hyp[i].above);
	l->nhyp = 0;
	if (l->ci + 1 == th->nctx) /* in the current context (else land_on) */
		close_above(e, th, th->ctxs[l->ci], (size_t)fi, take_slot(e, th, l->t, 0), 0);
	else
		land_on(e, th, l->ci, (size_t)fi, l->t);
	/* The held events run now; one may begin another lookahead, which needs the buffers:
	 * take them. */
	HeldEvent *ev = l->ev;
	uint64_t *lines = l->lines;
	size_t nev = l->nev;
	l->ev = NULL;
	l->lines = NULL;
	l->nev = l->capev = l->nlines = l->caplines = 0;
	for (size_t k = 0; k < nev; k++) {
		const HeldEvent *h = &ev[k];
		if (h->kind == K_HELD_COUNTER && !l->on) {
			counter_body(e, th, h->time, (int64_t)h->insns, (int64_t)h->cycles);
			continue;
		}
		if (h->kind == K_HELD_BREAK && !l->on) {
			break_body(e, th);
			continue;
		}
		if (l->on)
			hold(e, th, h->kind, h->state, h->in_tx, h->src, h->dst, h->time, h->insns,
			     h->cycles, h->gap_time, h->gap_insns, lines + h->line0, h->nlines);
		else
			branch_body(e, th, h->kind, h->state, h->in_tx, h->src, h->dst, h->time,
				    h->insns, h->cycles, h->gap_time, h->gap_insns,
				    lines + h->line0, h->nlines);
	}
	free(ev);
	free(lines);
}

/* engine.py: _settle_all */
void settle_all(Engine *e, Thread *th)
{
	while (th->look.on)
		settle(e, th);
}

/* engine.py: _hold */
void hold(Engine *e, Thread *th, int kind, int state, bool in_tx, int32_t src,
	  int32_t dst, int64_t time, uint64_t insns, uint64_t cycles, int64_t gap_time,
	  uint64_t gap_insns, const uint64_t *lines, size_t nlines)
{
	Lookahead *l = &th->look;
	if (l->nev == l->capev)
		l->ev = grow(e, l->ev, &l->capev, l->nev + 1, sizeof(HeldEvent));
	if (nlines) {
		if (l->nlines + nlines > l->caplines)
			l->lines =
			    grow(e, l->lines, &l->caplines, l->nlines + nlines, sizeof(uint64_t));
		memcpy(l->lines + l->nlines, lines, nlines * sizeof(uint64_t));
	}
	HeldEvent *h = &l->ev[l->nev++];
	*h = (HeldEvent){kind,	 state,	 src,	     dst,	in_tx, time,
			 gap_time, insns, cycles, gap_insns, l->nlines, nlines};
	l->nlines += nlines;
	bool followed = follow(e, th, h);
	if (!followed || l->nev >= LOOKAHEAD_EVENTS || decided(l))
		settle(e, th);
}
