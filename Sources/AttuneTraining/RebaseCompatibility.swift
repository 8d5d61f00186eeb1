import AttuneSpec

/// Whether the samples kept for one base model can train another: what `attune model rebase` checks before
/// it starts, so that an unsuitable new base is refused with its reasons rather than failing user by user.
/// A kept sample carries the old base's input feature and its label; the new base must read the same
/// input, of the same type and shape, take the label from the same feature, and (a classifier) know every
/// class the old one knew. Extra classes, other layers, another optimizer or another model kind are fine.
public enum RebaseCompatibility {
    /// Why `new` cannot take the samples kept for `old`; empty when it can.
    public static func problems(from old: UpdatableModel, to new: UpdatableModel) -> [String] {
        var problems: [String] = []
        if old.inputName != new.inputName {
            problems.append("the kept samples' input is '\(old.inputName)'; the new base reads '\(new.inputName)'")
        } else if let oldType = inputType(old), let newType = inputType(new), oldType != newType {
            problems.append("input '\(old.inputName)' is \(describe(oldType)) in the old base and \(describe(newType)) in the new one")
        }
        if old.labelFeatureName != new.labelFeatureName {
            problems.append("the kept samples' label is '\(old.labelFeatureName)'; the new base trains on '\(new.labelFeatureName)'")
        }
        let newLabels = Set(new.classLabels)
        let missing = old.classLabels.filter { !newLabels.contains($0) }
        if !missing.isEmpty {
            let shown = missing.prefix(5).map { "'\($0)'" }.joined(separator: ", ")
            problems.append("the new base has no class \(shown)\(missing.count > 5 ? " and \(missing.count - 5) more" : ""), which kept samples are labelled with")
        }
        if old.classLabels.isEmpty != new.classLabels.isEmpty {
            problems.append(old.classLabels.isEmpty ? "the old base is a regressor and the new one a classifier"
                                                    : "the old base is a classifier and the new one a regressor")
        }
        return problems
    }

    private static func inputType(_ model: UpdatableModel) -> CoreML_Specification_FeatureType? {
        model.spec.description_p.input.first { $0.name == model.inputName }?.type
    }

    private static func describe(_ type: CoreML_Specification_FeatureType) -> String {
        switch type.type {
        case .multiArrayType(let array)?:
            return "a multi-array of shape \(array.shape)"
        case .imageType(let image)?:
            return "a \(image.width)×\(image.height) image"
        case .doubleType?: return "a double"
        case .int64Type?: return "an int64"
        case .stringType?: return "a string"
        default: return "another type"
        }
    }
}
