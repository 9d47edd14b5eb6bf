package softmax

// SmallSettings are settings for a model and data small enough for tests:
// the conformance suite runs the trainer under them.
const SmallSettings = `{"samples": 512, "eval_samples": 128, "features": 16, "classes": 4, "batch_size": 16}`
