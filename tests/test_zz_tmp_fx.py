def test_x(tiny_model_dir):
    from pivotrl.testbed.tiny import load_tiny
    m,t=load_tiny(tiny_model_dir); print(len(t), t.padding_side)
