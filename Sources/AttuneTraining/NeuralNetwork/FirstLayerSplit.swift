import Foundation
import Synchronization

// A split mini-batch's first layer, cut by its outputs between the threads instead of by the rows
// (`BatchSplit`), when it is a big dense layer that trains.
//
// Why: cut by rows, each part's dW of that layer is a gradient buffer of its own, which the optimizer then
// reads back from the other core and adds value by value; at 784-128-10 and mini-batch 256 that update pass
// was 9% of the time. Cut by outputs, each part computes its outputs of the layer over every row, and later
// its rows of dW over every row, and updates those weights at once: no gradients to sum, and each thread's
// weights, velocity and gradient are its own. The rest of the chain is still cut by rows.
//
// The cut follows from the layer's shape and the part count alone, so the bits do not depend on the
// threads (as with `ProductSplit`).
struct FirstLayerSplit {
    /// Off (`TrainingSettings.firstLayerSplit`), the first layer is cut by rows too (to compare the two).
    static var enabled: Bool { TrainingSwitches.firstLayerSplit.load(ordering: .relaxed) }

    let layer: DenseLayer
    let parts: Int
    /// Part p: outputs `outputs[p]` of the layer, whose weights and biases are `ranges[p]`.
    let outputs: [Range<Int>]
    let ranges: [[Range<Int>]]
    /// Every other trainable range.
    let rest: [Range<Int>]

    init?(plan: NetworkPlan, parts: Int) {
        guard case .dense(let layer)? = plan.steps.first, layer.trainable, !layer.isSmall,
              plan.firstTrainableStep == 0, plan.steps.count > 1 else { return nil }
        self.layer = layer
        let split = ProductSplit(length: layer.outputs, parts: parts)
        self.parts = split.count
        outputs = (0..<split.count).map { split[$0] }
        ranges = outputs.map { units in
            let weights = (layer.weightOffset + units.lowerBound * layer.inputs)..<(layer.weightOffset + units.upperBound * layer.inputs)
            return layer.hasBias ? [weights, (layer.biasOffset + units.lowerBound)..<(layer.biasOffset + units.upperBound)] : [weights]
        }
        let own = [layer.weightOffset] + (layer.hasBias ? [layer.biasOffset] : [])
        rest = plan.slots.filter { !own.contains($0.offset) }.map { $0.offset..<($0.offset + $0.count) }
    }
}
