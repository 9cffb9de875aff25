"""lm-evaluation-harness (0.4.x) over the native model: `NanochatLM`, a TemplateLM that
answers lm-eval's three request types with our GPT and tokenizer (no transformers).

Tokenization follows CORE (nanochat/core_eval.py): every context starts with <|bos|> and
special-token text is plain text (Tokenizer.encode). lm-eval's TemplateLM splits a request
into context and continuation after encoding them together, and conditions an empty
context on `prefix_token_id`, here <|bos|> too.

- loglikelihood: rows cut to the last max_length + 1 tokens, right-padded (causal: padding
  comes after every scored position), in batches of similar length (lm-eval's Collator,
  longest first, one forward for choices that share all but their last token);
- loglikelihood_rolling: the document without <|bos|>, in lm-eval's disjoint windows
  conditioned on <|bos|>: every token scored once, <|bos|> never scored;
- generate_until: our KV-cache decoding (GPT.generate), one request at a time, stopping at
  <|bos|> (nanochat's document separator, its end of text) or as soon as the text holds a
  stop string, which is then cut off.

`model` is a GPT or, as scripts.lm_eval passes it, an `engine.Inference` over one (compiled
scoring and generation with --compile). max_length is the training context
(config.sequence_len), also what the exported model declares to lm-eval's own `hf` model.
Under torchrun, lm-eval gives each rank its share of the documents and gathers the results
on rank 0 through the primitives below.
"""

import contextlib

import torch
import torch.distributed as dist
import torch.nn.functional as F
from lm_eval.api.model import TemplateLM
from lm_eval.models.utils import Collator, handle_stop_sequences, normalize_gen_kwargs, postprocess_generated_text
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

DEFAULT_MAX_GEN_TOKS = 256  # lm-eval's default when a task does not say


class NanochatLM(TemplateLM):
    def __init__(self, model, tokenizer, device, batch_size=16, autocast=None, rank=0, world_size=1, seed=1234):
        super().__init__()
        self.model = model
        self.tok = tokenizer
        self._device = torch.device(device)
        self.batch_size = batch_size
        self.autocast = autocast or contextlib.nullcontext
        self._rank, self._world_size = rank, world_size
        self.seed = seed  # sampled generations: one generator seed per request, offset by its index
        self.max_length = model.config.sequence_len
        self.bos = tokenizer.get_bos_token_id()
        self.special_ids = set(tokenizer.special_tokens.values())

    # ----- tokens -----

    @property
    def eot_token_id(self):
        return self.bos

    @property
    def prefix_token_id(self):
        return self.bos

    def tok_encode(self, string, add_special_tokens=None, **kwargs):
        ids = self.tok.encode(string)
        return ids if add_special_tokens is False else [self.bos] + ids

    def tok_decode(self, tokens):
        """Text of the ordinary tokens: special tokens are dropped, as transformers'
        skip_special_tokens (lm-eval's hf model) drops them."""
        return self.tok.decode([t for t in tokens if t not in self.special_ids])

    # ----- scoring -----

    @torch.no_grad()
    def _span_logprobs(self, rows, spans):
        """log-softmax over the vocabulary, fp32 on the CPU, of positions [start, end) of each
        right-padded row: one forward for the batch, and only the scored positions leave the
        device (a whole (B, T, V) batch of log-probabilities would be gigabytes at T = 2048)."""
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), self.bos, dtype=torch.long)
        for i, row in enumerate(rows):
            ids[i, :len(row)] = torch.tensor(row, dtype=torch.long)
        with self.autocast():
            logits = self.model(ids.to(self._device))
        return [F.log_softmax(logits[i, start:end].float(), dim=-1).cpu() for i, (start, end) in enumerate(spans)]

    def _loglikelihood_tokens(self, requests, disable_tqdm=False, **kwargs):
        """(sum of log p(continuation | context), whether greedy decoding reproduces it) per
        request ((strings), context ids, continuation ids), in the requests' order."""
        order = Collator(requests, sort_fn=lambda r: (-len(r[1] + r[2]), tuple(r[1] + r[2])),
                         group_by="contexts", group_fn=lambda r: r[1] + r[2][:-1])
        results = []
        for chunk in order.get_batched(n=self.batch_size):
            rows = [(ctx + cont)[-(self.max_length + 1):][:-1] for _, ctx, cont in chunk]
            # position t predicts token t + 1: the continuation's logprobs end at the row's end
            spans = [(len(row) - len(cont), len(row)) for row, (_, _, cont) in zip(rows, chunk)]
            for (strings, ctx, cont), lp in zip(chunk, self._span_logprobs(rows, spans)):
                for key, cont_toks, span_lp in order.get_cache(req_str=strings, cxt_toks=ctx, cont_toks=cont,
                                                               logits=lp.unsqueeze(0)):
                    target = torch.tensor(cont_toks, dtype=torch.long)
                    span_lp = span_lp[0, -len(cont_toks):]
                    answer = (float(span_lp.gather(1, target[:, None]).sum()),
                              bool((span_lp.argmax(-1) == target).all()))
                    results.append(answer)
                    if key is not None:  # None: a window of loglikelihood_rolling
                        self.cache_hook.add_partial("loglikelihood", key, answer)
        return order.get_original(results)

    def loglikelihood_rolling(self, requests, disable_tqdm=False):
        windows, owner = [], []
        for i, (string,) in enumerate(r.args for r in requests):
            tokens = self.tok_encode(string, add_special_tokens=False)
            for ctx, cont in map(make_disjoint_window, get_rolling_token_windows(
                    token_list=tokens, prefix_token=self.prefix_token_id, max_seq_len=self.max_length,
                    context_len=1)):
                windows.append((None, ctx, cont))
                owner.append(i)
        totals = [0.0] * len(requests)
        for i, (logprob, _) in zip(owner, self._loglikelihood_tokens(windows)):
            totals[i] += logprob
        for r, total in zip(requests, totals):
            self.cache_hook.add_partial("loglikelihood_rolling", r.args, total)
        return totals

    # ----- generation -----

    def generate_until(self, requests, disable_tqdm=False):
        eot = self.tok.decode([self.eot_token_id])
        out = []
        for index, request in enumerate(requests):
            context, gen_kwargs = request.args
            kwargs = normalize_gen_kwargs(gen_kwargs, DEFAULT_MAX_GEN_TOKS)
            until = handle_stop_sequences(kwargs.pop("until", None), eos=eot)
            max_gen_toks = kwargs.pop("max_gen_toks")
            if max_gen_toks >= self.max_length:
                raise ValueError(f"the task asks for {max_gen_toks} generated tokens, more than the model's "
                                 f"{self.max_length}-token context")
            prompt = self.tok_encode(context)[-(self.max_length - max_gen_toks):]
            temperature = kwargs.get("temperature", 0.0) if kwargs.get("do_sample") else 0.0
            generated = []
            with self.autocast():
                for token in self.model.generate(prompt, max_gen_toks, temperature=temperature,
                                                 top_k=kwargs.get("top_k"), seed=self.seed + index):
                    if token == self.eot_token_id:
                        break
                    generated.append(token)
                    if any(stop in self.tok_decode(generated) for stop in until):
                        break
            text = postprocess_generated_text(self.tok_decode(generated), until, None)
            out.append(text)
            self.cache_hook.add_partial("generate_until", request.args, text)
        return out

    # ----- data parallel: lm-eval shards the documents by rank and gathers on rank 0 -----

    def all_gather(self, tensor):
        parts = [torch.zeros_like(tensor) for _ in range(self._world_size)]
        dist.all_gather(parts, tensor)
        return torch.stack(parts) if tensor.dim() == 0 else torch.cat(parts)

    def gather_object(self, obj, dst=0):
        parts = [None] * self._world_size if self._rank == dst else None
        dist.gather_object(obj, parts, dst=dst)
        return parts

    def barrier(self):
        dist.barrier()
