"""The GPU proof: the CUDA path run on a lent GPU machine in one prepared call.

Here (with the package registries): `make gpu-bundle` (bundle.py) packs what the device
lacks into two ignored folders of one call each. There: `python -m devtools.gpu.proof`
installs them, builds random-weight fp16 CUDA folders at real shapes (shapes/), and runs
cuda_check, the onnxruntime-genai peers and a served request, every result as JSON in $OUT.
In CI the same script runs as a dry run on CPU. docs/operations/gpu-proof.md has the recipe.
"""
