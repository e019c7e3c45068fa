# gpt-oss (OpenAI, 2025; HF GptOssConfig): layers alternate between a sliding window of 128 tokens and
# full attention, with a learned sink logit per head in every layer's softmax. Scaled down: the window
# keeps its fraction of gpt-oss's 4096-token initial context (1/32): 4 tokens at L = 128. Width, depth and
# data are train.py's small CPU defaults; its mixture of experts, GQA and YaRN (an extension of the 4096
# tokens, see docs/context-extension.md) are left out.
pos_encoding = 'rope'
layer_types = 'SF'            # S: sliding window; F: full attention (tiled: S F S F)
sliding_window = 4
sink_logits = True
out_dir = 'out-gpt_oss'
