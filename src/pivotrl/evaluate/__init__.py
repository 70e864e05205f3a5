"""Evaluation on held-out turns of any data set: `turns` scores a model (`pivotrl evaluate --turns`),
`compare` pairs models item by item with a paired cluster bootstrap (`pivotrl compare`)."""
