import AttuneSpec
import Foundation

/// A small job of image-like samples, for codec and broker tests.
func makeJob(id: String, user: String = "user-1", model: String = "digits", samples: Int = 2) -> Attune_V1_TrainingJob {
    var job = Attune_V1_TrainingJob()
    job.jobID = id
    job.userID = user
    job.model = model
    job.baseVersion = 3
    for i in 0..<samples {
        var sample = Attune_V1_Sample()
        var pixels = Attune_V1_FeatureValue()
        var array = Attune_V1_MultiArray()
        array.shape = [1, 2, 2]
        array.values = [0.0, 0.25, 0.5, Double(i)]
        pixels.multiArray = array
        var label = Attune_V1_FeatureValue()
        label.stringValue = "\(i % 10)"
        sample.features = ["image": pixels, "label": label]
        job.samples.append(sample)
    }
    job.parameters.epochs = 2
    job.parameters.learningRate = 0.01
    return job
}
