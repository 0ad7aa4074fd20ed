/*
 * mailbox.c: the hand-over between the caller's threads and the I/O thread
 * (giftclient_internal.h, "mailbox.c"): the command queue, command completion,
 * and the pool of operations with their completion, wait, test and free
 * (gift/client.h). Everything here runs under gift_client.mu and its one
 * condition variable; nothing here knows the engine or the network (the
 * caller wakes the I/O thread through its io table).
 */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif

#include <stdlib.h>
#include <string.h>

#include "giftclient_internal.h"

static int on_io_thread(const gift_client_t *c)
{
    return c->thread_started && pthread_equal(pthread_self(), c->thread);
}

void gift__cmd_put(gift_client_t *c, gift__cmd_t *cmd)
{
    pthread_mutex_lock(&c->mu);
    cmd->next = NULL;
    cmd->done = 0;
    cmd->rc = 0;
    if (c->subq_tail)
        c->subq_tail->next = cmd;
    else
        c->subq_head = cmd;
    c->subq_tail = cmd;
    pthread_mutex_unlock(&c->mu);
}

int gift__cmd_wait(gift_client_t *c, gift__cmd_t *cmd)
{
    int rc;
    pthread_mutex_lock(&c->mu);
    while (!cmd->done)
        pthread_cond_wait(&c->cv, &c->mu);
    rc = cmd->rc;
    pthread_mutex_unlock(&c->mu);
    return rc;
}

gift__cmd_t *gift__take_commands(gift_client_t *c)
{
    gift__cmd_t *l;
    pthread_mutex_lock(&c->mu);
    l = c->subq_head;
    c->subq_head = c->subq_tail = NULL;
    pthread_mutex_unlock(&c->mu);
    return l;
}

void gift__cmd_done(gift_client_t *c, gift__cmd_t *cmd, int rc)
{
    pthread_mutex_lock(&c->mu);
    cmd->rc = rc;
    cmd->done = 1;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

static void op_release_locked(gift_client_t *c, gift_op_t *op)
{
    op->pooled = 1;
    op->next = c->free_ops;
    c->free_ops = op;
}

void gift__op_complete(gift_client_t *c, gift_op_t *op)
{
    gift_op_cb cb = op->cb;
    void *arg = op->arg;
    int status = op->status;

    pthread_mutex_lock(&c->mu);
    op->done = 1;
    op->in_cb = cb != NULL;
    if (cb == NULL && op->free_req)
        op_release_locked(c, op);
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    if (cb == NULL)
        return;
    cb(op, status, arg);
    pthread_mutex_lock(&c->mu);
    op->in_cb = 0;
    if (op->free_req)
        op_release_locked(c, op);
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

gift_op_t *gift__op_alloc(gift_client_t *c)
{
    gift_op_t *op;
    pthread_mutex_lock(&c->mu);
    if ((op = c->free_ops) != NULL) {
        c->free_ops = op->next;
    } else if ((op = calloc(1, sizeof *op)) != NULL) {
        if (c->nall_ops == c->all_ops_cap) {
            size_t ncap = c->all_ops_cap ? 2 * c->all_ops_cap : 64;
            gift_op_t **n = realloc(c->all_ops, ncap * sizeof *n);
            if (n == NULL) {
                free(op);
                pthread_mutex_unlock(&c->mu);
                return NULL;
            }
            c->all_ops = n;
            c->all_ops_cap = ncap;
        }
        c->all_ops[c->nall_ops++] = op;
    }
    pthread_mutex_unlock(&c->mu);
    if (op == NULL)
        return NULL;
    memset(op, 0, sizeof *op);
    op->c = c;
    return op;
}

void gift__ops_free(gift_client_t *c)
{
    for (size_t i = 0; i < c->nall_ops; i++)
        free(c->all_ops[i]);
    free(c->all_ops);
    c->all_ops = NULL;
    c->nall_ops = c->all_ops_cap = 0;
}

/* ------------------------------------------------------------------ */
/* Waiting on operations (gift/client.h)                                 */
/* ------------------------------------------------------------------ */

int gift_op_wait(gift_op_t *op)
{
    gift_client_t *c;
    int st;
    if (op == NULL)
        return GIFT_EINVAL;
    c = op->c;
    pthread_mutex_lock(&c->mu);
    if (on_io_thread(c) && !op->done) {
        /* Waiting for an op on the thread that completes it cannot end. */
        pthread_mutex_unlock(&c->mu);
        return GIFT_EINVAL;
    }
    while (!op->done || (op->in_cb && !on_io_thread(c)))
        pthread_cond_wait(&c->cv, &c->mu);
    st = op->status;
    pthread_mutex_unlock(&c->mu);
    return st;
}

int gift_op_test(gift_op_t *op, int *status)
{
    int done;
    if (op == NULL)
        return 0;
    pthread_mutex_lock(&op->c->mu);
    done = op->done;
    if (done && status)
        *status = op->status;
    pthread_mutex_unlock(&op->c->mu);
    return done;
}

void gift_op_free(gift_op_t *op)
{
    gift_client_t *c;
    if (op == NULL)
        return;
    c = op->c;
    pthread_mutex_lock(&c->mu);
    if (op->pooled) {
        pthread_mutex_unlock(&c->mu);
        return;
    }
    if (on_io_thread(c)) {
        if (!op->done || op->in_cb)
            op->free_req = 1; /* freed once its callback returns */
        else
            op_release_locked(c, op);
        pthread_mutex_unlock(&c->mu);
        return;
    }
    while (!op->done || op->in_cb)
        pthread_cond_wait(&c->cv, &c->mu);
    op_release_locked(c, op);
    pthread_mutex_unlock(&c->mu);
}
