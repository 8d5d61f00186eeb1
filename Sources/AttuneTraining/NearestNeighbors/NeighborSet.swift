// Stored samples and the k-nearest-neighbours vote over them (Core ML's linear index with squared
// Euclidean distance).
//
//   samples  [N][D]   row-major float32, base samples first, then appended ones, in order
//   labels   [N]      one class label per sample (Core ML keeps class labels per stored sample)
//   query    [D]
//
// Rules, in the order they apply:
//   distance   d_i = Σ_j (query_j − sample_ij)², accumulated in float64 so an exact match is exactly 0
//              and the ranking agrees with a float64 reference.
//   neighbours the min(k, N) samples with the smallest d; equal distances rank by stored order (the
//              earlier sample first), also at the k-th place.
//   weights    uniform: 1 per neighbour. inverse distance: 1/d per neighbour, d being the squared distance
//              (the index's distance function, which Core ML's weighting is defined on; coremltools refuses
//              to convert scikit-learn's 1/Euclidean weighting to it). When the nearest neighbour is an
//              exact match (d = 0) only the exact matches vote, 1 each (the limit of 1/d as d → 0).
//   winner     the class with the largest total weight; a tie goes to the tied class whose nearest
//              neighbour ranks first.
//   empty set  no neighbours: the caller answers with the model's default label.
// Probabilities are each class's share of the total weight, in the order of `classes`.

/// How neighbours' votes are weighted.
enum NeighborWeighting: Sendable, Equatable {
    case uniform
    case inverseDistance
}

/// One neighbour of a query: the stored sample's index and its squared distance.
struct Neighbor: Sendable, Equatable {
    let sample: Int
    let distance: Double
}

/// The samples a k-NN searches, with their labels and the classes those labels form.
struct NeighborSet: Sendable {
    let dimensions: Int
    /// Row-major [count][dimensions].
    private(set) var samples: [Float] = []
    private(set) var labels: [ClassLabel] = []
    /// Distinct labels in order of first appearance: the classes this set can predict.
    private(set) var classes: [ClassLabel] = []
    private(set) var classOf: [ClassLabel: Int] = [:]
    /// The index in `classes` of each sample's label.
    private(set) var sampleClasses: [Int] = []

    var count: Int { labels.count }

    init(dimensions: Int) {
        self.dimensions = dimensions
    }

    /// Appends samples ([labels.count][dimensions], row-major) and their labels; new labels become classes.
    mutating func append(samples rows: [Float], labels newLabels: [ClassLabel]) {
        precondition(rows.count == newLabels.count * dimensions, "samples and labels do not pair up")
        samples += rows
        labels += newLabels
        sampleClasses.reserveCapacity(labels.count)
        for label in newLabels {
            if let index = classOf[label] {
                sampleClasses.append(index)
            } else {
                classOf[label] = classes.count
                sampleClasses.append(classes.count)
                classes.append(label)
            }
        }
    }

    /// The min(k, count) nearest samples to `query`, nearest first (ties in stored order).
    func nearest(to query: UnsafeBufferPointer<Float>, k: Int) -> [Neighbor] {
        precondition(query.count == dimensions && k >= 1)
        let wanted = min(k, count)
        guard wanted > 0 else { return [] }
        var best: [Neighbor] = []
        best.reserveCapacity(wanted + 1)
        let d = dimensions
        samples.withUnsafeBufferPointer { stored in
            for i in 0..<count {
                let row = stored.baseAddress! + i * d
                var sum = 0.0
                for j in 0..<d {
                    let diff = Double(query[j]) - Double(row[j])
                    sum += diff * diff
                }
                // Strictly closer than the current k-th: a later sample never displaces an equal earlier one.
                if best.count == wanted, sum >= best[wanted - 1].distance { continue }
                var position = best.count
                while position > 0, best[position - 1].distance > sum { position -= 1 }
                best.insert(Neighbor(sample: i, distance: sum), at: position)
                if best.count > wanted { best.removeLast() }
            }
        }
        return best
    }

    /// The vote of `neighbors` (nearest first): the winning class and every class's total weight.
    func vote(_ neighbors: [Neighbor], weighting: NeighborWeighting) -> (winner: Int, weights: [Double]) {
        precondition(!neighbors.isEmpty)
        var weights = [Double](repeating: 0, count: classes.count)
        let exactOnly = weighting == .inverseDistance && neighbors[0].distance == 0
        // Classes in the order their nearest neighbour ranks, so a tie resolves to the earliest.
        var order: [Int] = []
        for neighbor in neighbors {
            let weight: Double
            switch weighting {
            case .uniform: weight = 1
            case .inverseDistance:
                if exactOnly {
                    guard neighbor.distance == 0 else { continue }
                    weight = 1
                } else {
                    weight = 1 / neighbor.distance
                }
            }
            let c = sampleClasses[neighbor.sample]
            if weights[c] == 0 { order.append(c) }
            weights[c] += weight
        }
        var winner = order[0]
        for c in order.dropFirst() where weights[c] > weights[winner] { winner = c }
        return (winner, weights)
    }

    /// Predicts `count` queries ([count][dimensions], row-major); nil when the set is empty.
    func predict(_ queries: [Float], count queryCount: Int, k: Int,
                 weighting: NeighborWeighting) -> [Prediction]? {
        guard count > 0 else { return nil }
        precondition(queries.count == queryCount * dimensions)
        return queries.withUnsafeBufferPointer { all in
            (0..<queryCount).map { q in
                let query = UnsafeBufferPointer(rebasing: all[(q * dimensions)..<((q + 1) * dimensions)])
                let (winner, weights) = vote(nearest(to: query, k: k), weighting: weighting)
                let total = weights.reduce(0, +)
                return Prediction(label: classes[winner], classIndex: winner,
                                  probabilities: weights.map { $0 / total }, classes: classes)
            }
        }
    }
}
