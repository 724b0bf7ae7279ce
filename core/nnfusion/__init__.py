"""NNFusion itself: run the user's compiler on a model and read what its generated code really runs."""
