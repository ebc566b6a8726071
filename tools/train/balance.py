"""Auxiliary-loss-free load balancing (DeepSeek-V3 report, section 2.1.2).

Each router's e_score_correction_bias is added to the sigmoid scores for expert *selection* only.
After every optimizer step the bias of each expert moves by gamma against the sign of its load
error over that step's tokens: down if the expert got more than the mean load, up if less.

The counts come from a forward pre-hook on each router module (transformers' `mlp.gate`), which
recomputes the group-limited top-k selection from the router's own weight and bias, so it does not
depend on how transformers lays out its MoE internals. The biases are then shifted so that the
smallest is zero: selection is unchanged by a common shift (group scores add 2c, expert scores c),
and with non-negative biases every selection score is positive, so the masked-out experts of
unselected groups (which transformers fills with 0.0, vLLM with -inf) can never be picked.
"""
import torch
import torch.nn.functional as F


def select_experts(hidden, weight, bias, n_group, topk_group, top_k):
    scores = torch.sigmoid(F.linear(hidden.float(), weight.float()))
    choice = scores + bias.float()[None, :]
    n, e = choice.shape
    grouped = choice.view(n, n_group, e // n_group)
    group_scores = grouped.topk(min(2, e // n_group), dim=-1).values.sum(-1)
    keep = torch.zeros_like(group_scores).scatter_(1, group_scores.topk(topk_group, dim=-1).indices, 1.0)
    keep = keep[:, :, None].expand(n, n_group, e // n_group).reshape(n, e)
    choice = choice.masked_fill(keep == 0, float("-inf"))
    return choice.topk(top_k, dim=-1).indices


class LoadBalancer:
    def __init__(self, routers, config, gamma):
        """routers: {name: router module with .weight and .e_score_correction_bias}."""
        self.routers = routers
        self.gamma = gamma
        self.cfg = config
        e = config.n_routed_experts
        dev = next(iter(routers.values())).weight.device
        self.counts = {name: torch.zeros(e, device=dev) for name in routers}
        self.totals = {name: torch.zeros(e, device=dev) for name in routers}
        self.handles = [r.register_forward_pre_hook(self._hook(name), with_kwargs=True)
                        for name, r in routers.items()]
        for r in routers.values():
            r.e_score_correction_bias.requires_grad_(False)

    def _hook(self, name):
        def hook(module, args, kwargs):
            hidden = args[0] if args else kwargs["hidden_states"]
            with torch.no_grad():
                idx = select_experts(hidden.reshape(-1, hidden.shape[-1]), module.weight,
                                     module.e_score_correction_bias, self.cfg.n_group, self.cfg.topk_group,
                                     self.cfg.num_experts_per_tok)
                self.counts[name] += torch.bincount(idx.flatten(), minlength=self.counts[name].numel()).float()
        return hook

    @torch.no_grad()
    def update(self, record=True):
        """After an optimizer step: move the biases, reset this step's counts (adding them to the
        totals that summary() reports when record is set)."""
        for name, r in self.routers.items():
            load = self.counts[name]
            if load.sum() == 0:
                continue
            bias = r.e_score_correction_bias
            bias += self.gamma * torch.sign(load.mean() - load).to(bias.dtype)
            bias -= bias.min()
            if record:
                self.totals[name] += load
            load.zero_()

    def reset_counts(self):
        for c in self.counts.values():
            c.zero_()

    def summary(self):
        """Per router: the most and least loaded expert's load relative to a perfectly even load,
        over the recorded steps."""
        out = {}
        for name, r in self.routers.items():
            t = self.totals[name]
            if t.sum() == 0:
                continue
            rel = (t / t.mean()).tolist()
            out[name] = {"max_over_mean": round(max(rel), 3), "min_over_mean": round(min(rel), 3),
                         "bias": [round(b, 4) for b in r.e_score_correction_bias.float().tolist()]}
        return out

    def remove(self):
        for h in self.handles:
            h.remove()


def find_routers(module, prefix=""):
    return {prefix + name: m for name, m in module.named_modules()
            if hasattr(m, "e_score_correction_bias") and hasattr(m, "weight")}
