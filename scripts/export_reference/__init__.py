"""The reference pipeline behind `scripts/export-reference`: runs llama.cpp on the default
model and writes `reference-data/` (format: reference-data/README.md).

Modules, in pipeline order: `f32_model` (the dequantized F32 copy), `engine` (llama.cpp's C API
and the ggml_tensor mirror for the eval callback), `prompts` (intermediate tensors and greedy
decoding), `facts` (model facts), `tokenizer` (vocab tests and the hard-string corpus),
`quant` (quantized variants and block references), `__main__` (the manifest).
"""
