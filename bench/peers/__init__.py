"""ortserve beside another: onnxruntime-genai, llama.cpp's llama-server, the engine in process."""
