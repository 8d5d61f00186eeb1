import AttuneSpec
import Foundation
import XCTest

@testable import AttuneImage

/// Reading the model's image constraint and preprocessing, and the refusals of what cannot be fed.
final class ConstraintTests: XCTestCase {
    func imageType(_ width: Int64, _ height: Int64, _ space: CoreML_Specification_ImageFeatureType.ColorSpace)
        -> CoreML_Specification_ImageFeatureType {
        var type = CoreML_Specification_ImageFeatureType()
        type.width = width
        type.height = height
        type.colorSpace = space
        return type
    }

    /// The ImageInputError `body` throws (nil if it succeeds; a failure if it throws anything else).
    func refusal(_ body: () throws -> Void) -> ImageInputError? {
        do { try body(); return nil } catch let error as ImageInputError { return error } catch {
            XCTFail("unexpected \(error)")
            return nil
        }
    }

    func testFixedSizeAndColourSpaces() throws {
        XCTAssertEqual(try ImageConstraint(imageType(28, 14, .grayscale)),
                       ImageConstraint(width: 28, height: 14, colorSpace: .grayscale))
        XCTAssertEqual(try ImageConstraint(imageType(3, 2, .bgr)).count, 18)
        XCTAssertEqual(try ImageConstraint(imageType(3, 2, .rgb)).colorSpace, .rgb)
    }

    func testFlexibleSizeUsesTheDefaultOrIsRefused() throws {
        var ranged = imageType(64, 48, .rgb)
        var range = CoreML_Specification_ImageFeatureType.ImageSizeRange()
        range.widthRange.lowerBound = 32
        range.widthRange.upperBound = -1
        range.heightRange.lowerBound = 32
        range.heightRange.upperBound = 512
        ranged.imageSizeRange = range
        XCTAssertEqual(try ImageConstraint(ranged), ImageConstraint(width: 64, height: 48, colorSpace: .rgb))

        var noDefault = imageType(0, 0, .rgb)
        var sizes = CoreML_Specification_ImageFeatureType.EnumeratedImageSizes()
        var size = CoreML_Specification_ImageFeatureType.ImageSize()
        size.width = 10
        size.height = 10
        sizes.sizes = [size]
        noDefault.enumeratedSizes = sizes
        let error = refusal { _ = try ImageConstraint(noDefault) }
        guard case .unsupportedConstraint(let why)? = error else { return XCTFail("\(String(describing: error))") }
        XCTAssertTrue(why.contains("flexible size without a default"), why)
    }

    func testUnfeedableColourSpacesAreRefused() {
        for space in [CoreML_Specification_ImageFeatureType.ColorSpace.grayscaleFloat16, .invalidColorSpace] {
            let error = refusal { _ = try ImageConstraint(imageType(8, 8, space)) }
            guard case .unsupportedConstraint? = error else { return XCTFail("\(space): \(String(describing: error))") }
        }
    }

    /// A classifier with an image input "photo" and the given preprocessing entries.
    func model(_ preprocessing: [CoreML_Specification_NeuralNetworkPreprocessing]) -> CoreML_Specification_Model {
        var model = CoreML_Specification_Model()
        var input = CoreML_Specification_FeatureDescription()
        input.name = "photo"
        input.type.imageType = imageType(4, 3, .bgr)
        model.description_p.input = [input]
        var network = CoreML_Specification_NeuralNetworkClassifier()
        network.preprocessing = preprocessing
        model.neuralNetworkClassifier = network
        return model
    }

    func scalerEntry(_ name: String, scale: Float, red: Float) -> CoreML_Specification_NeuralNetworkPreprocessing {
        var entry = CoreML_Specification_NeuralNetworkPreprocessing()
        entry.featureName = name
        var scaler = CoreML_Specification_NeuralNetworkImageScaler()
        scaler.channelScale = scale
        scaler.redBias = red
        scaler.blueBias = 7
        entry.scaler = scaler
        return entry
    }

    func testFeatureFindsItsScalerByNameInTheModelOrAPipelineStage() throws {
        let feature = try ImageFeature(named: "photo", in: model([scalerEntry("other", scale: 9, red: 9),
                                                                  scalerEntry("photo", scale: 0.5, red: -1)]))
        XCTAssertEqual(feature.constraint, ImageConstraint(width: 4, height: 3, colorSpace: .bgr))
        XCTAssertEqual(feature.scaler, ImageScaler(channelScale: 0.5, redBias: -1, greenBias: 0, blueBias: 7, grayBias: 0))
        // An unnamed entry is the network's only image input's.
        XCTAssertEqual(try ImageFeature(named: "photo", in: model([scalerEntry("", scale: 2, red: 0)])).scaler?.channelScale, 2)
        XCTAssertNil(try ImageFeature(named: "photo", in: model([])).scaler)

        var pipeline = CoreML_Specification_Model()
        pipeline.description_p = model([]).description_p
        var stages = CoreML_Specification_Pipeline()
        stages.models = [model([scalerEntry("photo", scale: 3, red: 1)])]
        pipeline.pipelineClassifier.pipeline = stages
        XCTAssertEqual(try ImageFeature(named: "photo", in: pipeline).scaler?.channelScale, 3)
    }

    func testMeanImageAndMissingInputsAreRefused() {
        var mean = CoreML_Specification_NeuralNetworkPreprocessing()
        mean.featureName = "photo"
        mean.meanImage.meanImage = [1, 2, 3]
        XCTAssertEqual(refusal { _ = try ImageFeature(named: "photo", in: model([mean])) },
                       .meanImageUnsupported(featureName: "photo"))
        XCTAssertTrue(ImageInputError.meanImageUnsupported(featureName: "photo").description.contains("scaler"))
        XCTAssertEqual(refusal { _ = try ImageFeature(named: "label", in: model([])) }, .noImageInput(name: "label"))
    }
}
