"""The three embedded models' architectures and training settings, in one place.

Sizes are chosen so that all three fit in under 30 MB of bf16 (models/ travels with the working
tree to the GPU machine): specula-tiny ~7.7M parameters, specula-tiny-draft ~1.4M, and
specula-tiny-moe ~2.0M in the main model plus ~2.5M in its MTP layer (which stores its own copies
of the embedding and output head, as DeepSeek-V3 checkpoints do).
"""

# Special tokens take the first ids, so that every model shares them whatever the BPE learns.
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
ENDOFTEXT_ID, IM_START_ID, IM_END_ID = 0, 1, 2
VOCAB_SIZE = 8192
MAX_POSITIONS = 2048   # what config.json allows; training windows are SEQ_LEN tokens
SEQ_LEN = 512

NAMES = {"tiny": "specula-tiny", "draft": "specula-tiny-draft", "moe": "specula-tiny-moe",
         "eagle3": "specula-tiny-eagle3"}

_COMMON = dict(
    vocab_size=VOCAB_SIZE,
    max_position_embeddings=MAX_POSITIONS,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,   # saves VOCAB_SIZE * hidden parameters in the shipped files
    initializer_range=0.02,
    bos_token_id=None,
    eos_token_id=ENDOFTEXT_ID,
    pad_token_id=ENDOFTEXT_ID,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
)

# Qwen3ForCausalLM target: q/k norm, GQA 8 query heads over 2 kv heads, head_dim 32.
TINY = dict(_COMMON, hidden_size=256, intermediate_size=704, num_hidden_layers=8,
            num_attention_heads=8, num_key_value_heads=2, head_dim=32)

# Qwen3ForCausalLM draft: a quarter of the target's depth and half its width.
DRAFT = dict(_COMMON, hidden_size=128, intermediate_size=384, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, head_dim=32)

# DeepseekV3ForCausalLM: MLA with a q low-rank path, one dense layer, then MoE layers with one
# shared and 8 routed experts, sigmoid scores + e_score_correction_bias, group-limited top-2.
MOE = dict(_COMMON, hidden_size=128, intermediate_size=384, moe_intermediate_size=96,
           num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4,
           q_lora_rank=64, kv_lora_rank=32, qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32,
           n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2,
           n_group=4, topk_group=2, norm_topk_prob=True, routed_scaling_factor=2.5,
           first_k_dense_replace=1, num_nextn_predict_layers=1, rope_interleave=True)
# Keys DeepSeek-V3's own config.json carries that transformers' config class may not keep:
# written into config.json after saving so that an engine reading them finds V3's values.
MOE_EXTRA_CONFIG = {"scoring_func": "sigmoid", "topk_method": "noaux_tc"}

# EAGLE-3 head for specula-tiny (tools/train/eagle3.py): one Llama decoder layer over
# concat(input_layernorm(embed(t_{p+1})), hidden_norm(g)), g = fc(target features of layers
# EAGLE3_AUX_LAYERS) or the previous draft step's output; its own lm_head over a draft vocabulary.
EAGLE3 = dict(hidden_size=256, intermediate_size=704, num_attention_heads=8, num_key_value_heads=2,
              head_dim=32, rms_norm_eps=1e-6, rope_theta=10000.0, vocab_size=VOCAB_SIZE,
              draft_vocab_size=VOCAB_SIZE, target_hidden_size=256)
# The whole vocabulary: the first heads' 4,096 most frequent ids covered only 94.7 % of the
# target's greedy tokens, so about one rejection in three was a token the head could not draft.
EAGLE3_AUX_LAYERS = (2, 4, 5)   # the residual stream entering these target layers (hidden_states[i])
EAGLE3_TTT_STEPS = 5            # training-time test: draft steps unrolled per training row
EAGLE3_STEP_DECAY = 0.8         # loss = sum_s EAGLE3_STEP_DECAY**s * loss_s
EAGLE3_MASK_OUT_OF_VOCAB = True  # drop rows whose target argmax is outside the draft vocabulary

MTP_LOSS_WEIGHT = 0.3      # lambda of the DeepSeek-V3 report's L_main + lambda * L_MTP
BIAS_UPDATE_SPEED = 1e-3   # gamma of the report's aux-loss-free balancing

# Training runs (steps of BATCH x SEQ_LEN tokens). time_limit_s is a safety net: the cosine
# schedule follows max(step / steps, elapsed / time_limit_s), so a slow machine still anneals.
TRAIN = {
    "tiny": dict(steps=4000, batch=64, lr=3e-3, warmup=200, weight_decay=0.1, seed=1, time_limit_s=270),
    "moe": dict(steps=4000, batch=64, lr=3e-3, warmup=200, weight_decay=0.1, seed=2, time_limit_s=330),
    "draft": dict(steps=7000, batch=64, lr=4e-3, warmup=200, weight_decay=0.1, seed=3, time_limit_s=300),
    # Bounded by time: the stage (prepare + train + evaluate + fixtures) must fit one 10-minute call.
    "eagle3": dict(steps=8000, batch=64, lr=3e-3, warmup=200, weight_decay=0.01, seed=4, time_limit_s=240),
    # A later call's training of the shipped head (`train --model eagle3 --init-from DIR`): the first
    # stopped at its time limit after 3,463 of 8,000 steps; new windows (seed + earlier runs - 1), a
    # lower peak. The stage must fit one 10-minute call: prepare ~1-2 min + training + ~1.5 min of
    # loading, saving, evaluation and fixtures (the second run took ~366 s of wall time at 240 s).
    "eagle3-continue": dict(steps=8000, batch=64, lr=1e-3, warmup=100, weight_decay=0.01, seed=5, time_limit_s=300),
}
DRY_RUN_STEPS = 40
