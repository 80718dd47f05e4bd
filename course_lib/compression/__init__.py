"""Making the model small: pruning, quantization, k-means weight sharing, Huffman coding, distillation.

One module per technique; `pipeline` chains them into Deep Compression (Han et al., 2016).
"""
