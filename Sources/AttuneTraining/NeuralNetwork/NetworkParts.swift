import AttuneSpec

/// The fields Core ML's three neural-network model types (classifier, regressor, plain network) share,
/// read from whichever one a spec holds, so the engine handles the three alike.
struct NetworkParts {
    var layers: [CoreML_Specification_NeuralNetworkLayer]
    var preprocessing: [CoreML_Specification_NeuralNetworkPreprocessing]
    var updateParams: CoreML_Specification_NetworkUpdateParameters
    /// Only a classifier has class labels (and may name the layer that gives their probabilities).
    var isClassifier: Bool
    var classLabels: CoreML_Specification_NeuralNetworkClassifier.OneOf_ClassLabels?
    var labelProbabilityLayerName: String

    /// nil when the spec is not a neural network.
    init?(_ spec: CoreML_Specification_Model) {
        switch spec.type {
        case .neuralNetworkClassifier(let nn)?:
            self.init(layers: nn.layers, preprocessing: nn.preprocessing, updateParams: nn.updateParams,
                      isClassifier: true, classLabels: nn.classLabels,
                      labelProbabilityLayerName: nn.labelProbabilityLayerName)
        case .neuralNetworkRegressor(let nn)?:
            self.init(layers: nn.layers, preprocessing: nn.preprocessing, updateParams: nn.updateParams,
                      isClassifier: false, classLabels: nil, labelProbabilityLayerName: "")
        case .neuralNetwork(let nn)?:
            self.init(layers: nn.layers, preprocessing: nn.preprocessing, updateParams: nn.updateParams,
                      isClassifier: false, classLabels: nil, labelProbabilityLayerName: "")
        default:
            return nil
        }
    }

    private init(layers: [CoreML_Specification_NeuralNetworkLayer],
                 preprocessing: [CoreML_Specification_NeuralNetworkPreprocessing],
                 updateParams: CoreML_Specification_NetworkUpdateParameters, isClassifier: Bool,
                 classLabels: CoreML_Specification_NeuralNetworkClassifier.OneOf_ClassLabels?,
                 labelProbabilityLayerName: String) {
        self.layers = layers
        self.preprocessing = preprocessing
        self.updateParams = updateParams
        self.isClassifier = isClassifier
        self.classLabels = classLabels
        self.labelProbabilityLayerName = labelProbabilityLayerName
    }

    /// Replaces the layers of the spec's network, whichever type it is; every other field stays as it was.
    func writeLayers(into model: inout CoreML_Specification_Model) {
        switch model.type {
        case .neuralNetworkClassifier(var nn)?:
            nn.layers = layers
            model.neuralNetworkClassifier = nn
        case .neuralNetworkRegressor(var nn)?:
            nn.layers = layers
            model.neuralNetworkRegressor = nn
        case .neuralNetwork(var nn)?:
            nn.layers = layers
            model.neuralNetwork = nn
        default:
            preconditionFailure("NetworkParts written into a model that is not a neural network")
        }
    }
}
